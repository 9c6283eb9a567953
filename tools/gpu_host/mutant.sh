# Sourced by tools/gpu_host/*.sh: a copy of the plugin in $MUTANT_DIR (default /tmp/mutant; scripts run side by side on
# one host take one each) with the capture-view bug put back -- the sm_90a
# decode's block-table bound taken from the view's width instead of the table's storage. Tests and the accuracy gate
# must fail on it. Use it with PYTHONPATH=$MUTANT_PYTHONPATH (it shadows the installed plugin), from another working
# directory or with PYTHONSAFEPATH=1 (`python -m` and `python -c` put the working directory first on sys.path).
MUTANT_DIR=${MUTANT_DIR:-/tmp/mutant}
rm -rf $MUTANT_DIR && mkdir -p $MUTANT_DIR && cp -r sglang_snapmla kernels tests harness pyproject.toml $MUTANT_DIR/
ln -sfn $MUTANT_DIR/kernels $MUTANT_DIR/sglang_snapmla/kernels
sed -i 's|return block_table.untyped_storage().nbytes() // block_table.element_size() - block_table.storage_offset()|return block_table.shape[0] * block_table.shape[1]|' \
  $MUTANT_DIR/sglang_snapmla/ops.py
grep -q "return block_table.shape\[0\] \* block_table.shape\[1\]" $MUTANT_DIR/sglang_snapmla/ops.py \
  || { echo "mutant.sh: the mutation no longer applies (ops.block_table_entries changed)"; exit 1; }
MUTANT_PYTHONPATH=$MUTANT_DIR:$PYTHONPATH
