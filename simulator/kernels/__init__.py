"""The executor's whole-tensor kernels by op family (``exec_ops``: integer arithmetic,
``exec_conv`` / ``exec_epilogue``: conv, ``exec_pool``: pools and reductions,
``exec_table_ops`` / ``exec_dense``: tables, ``exec_layout``: data movement, ``exec_cpu``:
float islands, ``exec_native*``: the calls into the compiled kernels), and the exact torch
primitives they share (``exec_kernels``)."""
