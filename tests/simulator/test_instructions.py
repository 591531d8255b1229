"""The instruction table: one entry per Op, every instruction has a reference and a
kernel, and the executor's and compile's tables are its views."""

from __future__ import annotations

from simulator.arith.custom_ops import CUSTOM_OPS
from simulator.arith.int_ops import INT_OPS
from simulator.instructions import FROM_ONNX, INSTRUCTIONS, NHWC_OPS, ONNX_REFERENCE, TABLE
from simulator.program.isa import Op
from simulator.runtime import native, packed
from simulator.runtime.executor import KERNELS


def test_one_entry_per_instruction():
    assert [i.op for i in TABLE] == list(Op)


def test_every_instruction_has_a_reference_and_a_kernel():
    for i in TABLE:
        assert callable(i.kernel), i.op
        if i.onnx_op is None:
            assert callable(i.reference) or i.reference == ONNX_REFERENCE, i.op
        else:
            assert i.reference is CUSTOM_OPS[i.onnx_op].evaluate, i.op


def test_executor_and_compile_tables_are_views():
    assert {i.op: i.kernel for i in TABLE} == KERNELS
    assert {i.onnx_op: i.op for i in TABLE if i.onnx_op} == FROM_ONNX
    assert set(INT_OPS) <= set(FROM_ONNX)
    assert {Op.CONV, Op.ADD, Op.CLIP, Op.MAXPOOL, Op.REQUANT} == NHWC_OPS


def test_every_compiled_kernel_belongs_to_an_instruction():
    claimed = {n for i in INSTRUCTIONS.values() for n in i.native}
    probes = {"qp_cpu_ok", "qp_amx_ok", "qp_threads", "qp_pool_sizes", "qp_pool_owners",
              "qp_pool_wake", "qp_pool_sleepers", "qp_pool_woken_spin", "qp_np_view",
              "qp_pad_offset", *packed.RUNNERS}
    analysis = {"qp_pair_sums"}  # analysis.metrics.sums: no instruction's, it shares the build
    assert claimed <= set(native.SIGNATURES)
    assert set(native.SIGNATURES) - claimed == probes | analysis
