# Sourced by tools/gpu_host/multi_gpu_*.sh: SGLang's parallel layouts by name.
#   layout_flags tp2|dp2|dp4|dp8 -> the server flags; layout_gpus LAYOUT -> the GPUs it needs (from 0), comma-separated
layout_flags() {
  case $1 in
    tp2) echo "--tp 2" ;;
    dp2) echo "--tp 2 --enable-dp-attention --dp 2" ;;
    dp4) echo "--tp 4 --enable-dp-attention --dp 4" ;;
    dp8) echo "--tp 8 --enable-dp-attention --dp 8" ;;
    *) echo "unknown layout $1 (tp2, dp2, dp4, dp8)" >&2; return 2 ;;
  esac
}
layout_gpus() {
  case $1 in dp8) echo 0,1,2,3,4,5,6,7 ;; dp4) echo 0,1,2,3 ;; *) echo 0,1 ;; esac
}
