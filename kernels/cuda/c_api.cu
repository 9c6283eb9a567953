// C entry point of the sm_90a split decode for the prebuilt shared library (sglang_snapmla/prebuilt.py loads it with
// ctypes): no torch, no pybind, the CUDA runtime linked statically, so the library needs neither nvcc nor a matching
// torch where it serves, only a driver for the CUDA release that built it. The torch binding (binding.cpp) is the
// build-at-first-use path of the same launcher.
#include "snapmla_decode_sm90.h"

extern "C" {

// One launch (snapmla::launch_decode_split_sm90, snapmla_decode_sm90.h); `stream` is the caller's cudaStream_t
// (torch's current stream). Returns the cudaError_t of the launch as an int (0: success).
int snapmla_decode_split_sm90(const snapmla::DecodeParams* params, void* stream) {
  return static_cast<int>(snapmla::launch_decode_split_sm90(*params, static_cast<cudaStream_t>(stream)));
}

// sizeof(DecodeParams) as this library was built: its loader refuses a library whose layout differs from its own
// mirror of the struct (a library built from another revision of the header).
size_t snapmla_decode_params_size() { return sizeof(snapmla::DecodeParams); }

const char* snapmla_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // extern "C"
