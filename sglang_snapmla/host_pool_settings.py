"""What the snapmla HiCache host pool (host_pool.py) serves, importable on any SGLang release (the server-args check
reads it before refusing another release)."""

LAYOUTS = ("layer_first", "page_first", "page_first_direct")  # --hicache-mem-layout
IO_BACKENDS = ("kernel", "direct")  # --hicache-io-backend: accepted, pages move with the host pool's own copies
STORAGE_BACKENDS = ("file",)  # --hicache-storage-backend verified with 644-byte records
