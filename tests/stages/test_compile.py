"""compile: the .hbm computes exactly what quantized.onnx computes; fusion; refusals."""

import dataclasses

import numpy as np
import pytest

from schemas.artifacts import HbmModel
from schemas.errors import ArtifactError, StageError
from simulator.kernels import exec_ops
from simulator.program import hbm
from simulator.program.isa import Op
from simulator.runtime import executor as executor_module
from simulator.runtime import native
from simulator.runtime.executor import Executor
from simulator.runtime.frozen import Frozen
from simulator.runtime.replay import Replays
from stages.compile import compile_model
from stages.convert.stage import run_integer
from stages.exactness import batch_ranges, check_evaluation, check_exact
from stages.onnx_runner import OnnxRunner
from stages.registry_types import StageCall
from tests.stages.helpers import H, break_frozen_plan, run_stages

CHAIN = ("prepare", "calibrate", "pre_export", "export", "convert", "compile")


def _compile(tmp_path_factory, **sections):
    from schemas.spec import parse_spec
    from schemas.store import RunStore
    from stages.context import RunContext
    from stages.registry import code_version
    from tests.conftest import tiny_spec_dict

    spec = parse_spec(tiny_spec_dict(**sections), "t")
    run = RunStore(tmp_path_factory.mktemp("runs")).create_run(
        "tiny", "", "0" * 64, code_version(), {}, {}
    )
    ctx = RunContext(spec=spec, run=run, code_version=code_version())
    return ctx, run_stages(ctx, *CHAIN)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return _compile(tmp_path_factory)


@pytest.fixture(scope="module")
def residual(tmp_path_factory):
    """tests.models.ResidualMlpNet through compile."""
    data = {"dataset": "tests.models:residual_mlp_data", "calibration_samples": 64,
            "evaluation_samples": 64, "batch_size": 32}  # fmt: skip
    return _compile(tmp_path_factory, model={"factory": "tests.models:residual_mlp"}, data=data)


def test_hbm_gives_identical_integers_and_outputs(compiled):
    ctx, arts = compiled
    program = hbm.load(ctx.run.path(arts["compile"].hbm_file))
    x = ctx.evaluation.x
    outs, got = Executor(program).run({"x": x}, capture=True)
    ref_outs, ref = run_integer(ctx.run.root, arts["convert"], x)
    assert len(got) >= 5
    for lid, ints in got.items():
        assert np.array_equal(ints, ref[lid][0]), lid
    assert np.array_equal(next(iter(outs.values())), ref_outs[0])
    assert arts["compile"].metrics[0].value == arts["convert"].metrics[0].value


def test_replayed_and_frozen_runs_give_the_same_integers(compiled):
    """Batches after an executor's first runs come from replays and then from the frozen
    plan (simulator.runtime.replay, simulator.runtime.frozen): the outputs stay quantized.onnx's."""
    ctx, arts = compiled
    ex = Executor(hbm.load(ctx.run.path(arts["compile"].hbm_file)))
    x, rng = ctx.evaluation.x, np.random.default_rng(0)
    for _ in range(6):
        xb = x[rng.permutation(len(x))]
        outs, _ = ex.run({"x": xb})
        ref_outs, _ = run_integer(ctx.run.root, arts["convert"], xb)
        assert np.array_equal(next(iter(outs.values())), ref_outs[0])
    assert isinstance(ex._frozen, Frozen) == (native.library() is not None)


def test_relu_fused_into_conv_and_add_nhwc_padded(compiled):
    ctx, arts = compiled
    assert ["conv", "relu"] in arts["compile"].fused
    program = hbm.load(ctx.run.path(arts["compile"].hbm_file))
    conv = next(i for i in program.instructions if i.layer_ids == ("conv", "relu"))
    assert conv.attrs["layout"] == "nhwc" and conv.attrs["relu"] == 1
    weight = program.constants[conv.consts[0]]
    assert weight.shape[0] % 16 == 0 and weight.shape[-1] % 16 == 0  # [O_pad, kh, kw, C_pad]


def test_conv_feeding_only_an_add_becomes_one_instruction(compiled):
    """TinyNet's ``relu(y + conv2(y))``: conv2 keeps its int32 accumulator, the add
    requantizes once; compile emits both (and the relu) as one CONV with two inputs."""
    ctx, arts = compiled
    program = hbm.load(ctx.run.path(arts["compile"].hbm_file))
    pairs = [i for i in program.instructions if i.op is Op.CONV and len(i.inputs) == 2]
    assert len(pairs) == 1
    ins = pairs[0]
    assert ins.layer_ids[0] == "conv2" and len(ins.layer_ids) == 3  # conv2, the add, relu
    assert list(ins.layer_ids) in arts["compile"].fused
    assert len(ins.consts) == 7 and ins.attrs["out_dtype"] == "int8" and ins.attrs["relu"] == 1
    assert not any(i.op is Op.ADD for i in program.instructions)
    listing = ctx.run.path("debug/hbm.txt").read_text()
    assert ", ".join(ins.layer_ids) in listing


@pytest.mark.parametrize("kernel", [True, False], ids=["compiled", "linear-then-add"])
def test_linear_feeding_only_an_add_becomes_one_instruction(residual, kernel, monkeypatch):
    """``y + fc2(gelu(fc1(y)))``: fc2 and the add are one LINEAR ``x, y -> out`` with the
    add's constants. In the compiled kernel (the linear's epilogue adds ``y``) or as the
    linear's int32 output and then the add, its runs (captured, replayed, frozen) give
    quantized.onnx's integers."""
    ctx, arts = residual
    program = hbm.load(ctx.run.path(arts["compile"].hbm_file))
    pairs = [i for i in program.instructions if i.op is Op.LINEAR and len(i.inputs) == 2]
    assert len(pairs) == 1 and pairs[0].layer_ids[0] == "fc2" and len(pairs[0].consts) == 7
    assert not any(i.op is Op.ADD for i in program.instructions)
    if not kernel:
        monkeypatch.setattr(exec_ops, "linear_add_plan", lambda *a: None)
    ex, x, rng = Executor(program), ctx.evaluation.x, np.random.default_rng(1)
    _, got = ex.run({"x": x}, capture=True)
    _, ref = run_integer(ctx.run.root, arts["convert"], x)
    for lid, ints in got.items():
        assert np.array_equal(ints, ref[lid][0]), lid
    for _ in range(5):
        xb = x[rng.permutation(len(x))]
        want = run_integer(ctx.run.root, arts["convert"], xb)[0][0]
        assert np.array_equal(next(iter(ex.run({"x": xb})[0].values())), want)
    fused = [v for k, v in ex.consts.derived.items() if k[0] == "linear_add"]
    assert len(fused) == 1 and (fused[0] is not None) == (kernel and native.library() is not None)
    assert isinstance(ex._frozen, Frozen) == (native.library() is not None)


def test_a_changed_number_is_caught(compiled):
    ctx, arts = compiled
    program = hbm.load(ctx.run.path(arts["compile"].hbm_file))
    conv = next(i for i in program.instructions if i.layer_ids == ("conv", "relu"))
    consts = dict(program.constants)
    consts[conv.consts[2]] = consts[conv.consts[2]] * 2  # the requantize multipliers
    broken = dataclasses.replace(program, constants=consts)
    with pytest.raises(StageError, match="layer relu differs from quantized.onnx on the kernels"):
        check_exact(broken, ctx.run.root, arts["convert"], ctx.evaluation.x[:2], "compile")


def test_the_check_covers_every_path_layers_and_outputs(compiled):
    """compile's check runs the probe samples through the kernels, the replays and the
    frozen plan, and lists what it compared in debug/bit_exact.txt."""
    ctx, arts = compiled
    program = hbm.load(ctx.run.path(arts["compile"].hbm_file))
    exact = check_exact(program, ctx.run.root, arts["convert"], ctx.evaluation.x[:3], "compile")
    assert exact.paths[0].startswith("kernels") and exact.samples == 3
    if native.library() is not None:
        assert exact.paths[2:] == ("replays", "replays", "frozen plan")
    assert set(exact.layers) == set(program.captures) and exact.outputs == ("head",)
    assert {"conv", "conv2", "add"} <= set(exact.not_held)
    text = ctx.run.path("debug/bit_exact.txt").read_text()
    assert "frozen plan" in text or native.library() is None
    assert "layers compared on runs 1-3: " in text and "relu" in text


def _recompile(ctx, arts):
    return compile_model(arts["convert"], ctx, StageCall("compile", H, H, "test"))


@pytest.mark.skipif(native.library() is None, reason="no frozen plan without the kernels")
def test_a_wrong_frozen_plan_output_fails_compile(compiled, monkeypatch):
    """The frozen plan gives compile's (and board_sim's) top-1: one value off in its
    output must stop compile, naming the output and the path."""
    break_frozen_plan(monkeypatch)
    with pytest.raises(StageError, match="output head differs .* on the frozen plan path: 1 of"):
        _recompile(*compiled)


@pytest.mark.skipif(native.library() is None, reason="no replays without the kernels")
def test_a_wrong_replayed_instruction_fails_compile_naming_its_layer(compiled, monkeypatch):
    calls = Replays._calls

    def flip(self, i, instr, state, xs):
        ys = calls(self, i, instr, state, xs)
        if ys is not None and instr.layer_ids == ("conv", "relu"):
            ys = [ys[0].clone(), *ys[1:]]
            ys[0].view(-1)[0] ^= 1
        return ys

    monkeypatch.setattr(Replays, "_calls", flip)
    with pytest.raises(StageError, match="layer relu differs .* on the replays path"):
        _recompile(*compiled)


def test_a_layer_the_reference_lacks_is_an_error(compiled):
    ctx, arts = compiled
    program = hbm.load(ctx.run.path(arts["compile"].hbm_file))
    ghost = dataclasses.replace(program, captures={**program.captures, "ghost": "output"})
    with pytest.raises(StageError, match=r"layers.json lacks: \['ghost'\]"):
        check_exact(ghost, ctx.run.root, arts["convert"], ctx.evaluation.x[:2], "compile")
    first = dataclasses.replace(program.instructions[0], layer_ids=("phantom",))
    phantom = dataclasses.replace(program, instructions=[first, *program.instructions[1:]])
    with pytest.raises(StageError, match="phantom"):
        check_exact(phantom, ctx.run.root, arts["convert"], ctx.evaluation.x[:2], "compile")


def test_a_split_names_a_layer_without_a_tensor_of_its_own(compiled):
    """A multi-output instruction (shufflenet's chunk, a Split) names the split's layer,
    which layers.json cannot hold (it has no one tensor): not an unknown layer."""
    from stages.exactness import _check_known

    ctx, arts = compiled
    program = hbm.load(ctx.run.path(arts["compile"].hbm_file))
    split = dataclasses.replace(program.instructions[0], outputs=("a", "b"), layer_ids=("chunk",))
    ref = {lid: None for lid in program.captures}
    ref.update({lid: None for i in program.instructions for lid in i.layer_ids})
    _check_known(dataclasses.replace(program, instructions=[split]), ref, "compile")
    one = dataclasses.replace(split, outputs=("a",))
    with pytest.raises(StageError, match="chunk"):
        _check_known(dataclasses.replace(program, instructions=[one]), ref, "compile")


def test_a_float_island_names_a_layer_without_integers(compiled):
    """A CPU instruction of a float island (convert's float_ops: a ConvTranspose, a
    LogSoftmax) names a layer layers.json has no integers for: not an unknown layer."""
    from stages.exactness import _check_known

    ctx, arts = compiled
    program = hbm.load(ctx.run.path(arts["compile"].hbm_file))
    island = dataclasses.replace(program.instructions[0], op=Op.CPU, layer_ids=("up",))
    ref = {lid: None for lid in program.captures}
    with_island = dataclasses.replace(program, instructions=[island])
    _check_known(with_island, ref, "compile", {"up"})
    with pytest.raises(StageError, match=r"\['up'\]"):
        _check_known(with_island, ref, "compile")


def test_tampered_hbm_is_refused(compiled):
    """One flipped byte is refused. The module's tests share the compiled files, so the
    original is written back: left tampered, later tests failed wherever a test that
    recompiles (only with the compiled kernels) did not run in between to rewrite it."""
    ctx, arts = compiled
    path = ctx.run.path(arts["compile"].hbm_file)
    original = path.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    try:
        with pytest.raises(ArtifactError, match="expected sha256"):
            ctx.run.load_artifact("compile", HbmModel)
    finally:
        path.write_bytes(original)
    assert ctx.run.load_artifact("compile", HbmModel).hbm_file == arts["compile"].hbm_file


def test_a_class_token_expanded_to_the_batch_compiles_exact(tmp_path_factory):
    """The token's Expand reads the batch at run time: Shape, the Concat of its target and
    the Expand of the constant token run on the CPU; every batch size, through the first
    runs, the replays and the frozen plan, gives quantized.onnx's numbers."""
    data = {"dataset": "tests.models:class_token_data", "calibration_samples": 32,
            "evaluation_samples": 32, "batch_size": 8}  # fmt: skip
    ctx, arts = _compile(tmp_path_factory, model={"factory": "tests.models:class_token"}, data=data)
    program = hbm.load(ctx.run.path(arts["compile"].hbm_file))
    cpu = [i.attrs["op_type"] for i in program.instructions if i.op is Op.CPU]
    assert cpu == ["Shape", "Concat", "Expand"]
    ex, x = Executor(program), ctx.evaluation.x
    for batch in (1, 3, 1, 8, 3, 1, 8, 3):
        outs, _ = ex.run({"x": x[:batch]})
        ref_outs, _ = run_integer(ctx.run.root, arts["convert"], x[:batch])
        assert np.array_equal(next(iter(outs.values())), ref_outs[0]), batch


@pytest.mark.skipif(native.library() is None, reason="no frozen plan without the kernels")
def test_a_frozen_plan_wrong_only_on_the_evaluation_batches_fails_compile(compiled, monkeypatch):
    """The probe batch (4 samples) and the evaluation's batches (32) are two geometries,
    two frozen plans: a plan wrong only on the evaluation's gave compile's metrics unseen.
    The executor that evaluates is now checked on its own batches first."""
    ctx, _ = compiled
    break_frozen_plan(monkeypatch, rows=ctx.spec.data.batch_size)
    with pytest.raises(StageError, match="output head differs from quantized.onnx on the "
                       "frozen plan path, the evaluation's batch of 32 samples: 1 of"):  # fmt: skip
        _recompile(*compiled)


def test_the_evaluation_batches_are_its_geometries():
    assert batch_ranges(64, 32) == [(0, 32)]
    assert batch_ranges(64, 48) == [(0, 48), (48, 64)]
    assert batch_ranges(10, 32) == [(0, 10)]


def test_the_last_smaller_batch_is_checked_on_its_own_geometry(compiled, monkeypatch):
    """A split that does not divide into batches ends on a smaller one, which the kernels
    run (replays and the plan hold for the first batch's geometry): a kernel wrong only
    there is caught, naming that batch."""
    ctx, arts = compiled
    program = hbm.load(ctx.run.path(arts["compile"].hbm_file))
    runner = OnnxRunner(ctx.run.path(arts["convert"].onnx_file))
    feeds = [{"x": ctx.evaluation.x[a:b]} for a, b in batch_ranges(64, 48)]
    reference = lambda feed: runner.run(feed["x"])  # noqa: E731
    runs = check_evaluation(Executor(program), feeds, reference, "compile")
    assert [n for n, _ in runs] == [48] * 5 + [16] and runs[5][1].startswith("kernels")
    assert runs[4][1] == "frozen plan" or native.library() is None
    last = program.instructions[-1]
    real = executor_module.KERNELS[last.op]

    def off_on_16_rows(instr, bufs, consts):
        ys = real(instr, bufs, consts)
        if instr is last and ys[0].shape[0] == 16:
            ys = [ys[0].clone(), *ys[1:]]
            ys[0].view(-1)[0] += 1
        return ys

    monkeypatch.setitem(executor_module.KERNELS, last.op, off_on_16_rows)
    with pytest.raises(StageError, match="on the kernels .* the evaluation's batch of 16 samples"):
        check_evaluation(Executor(program), feeds, reference, "compile")
    ok = check_evaluation(Executor(program), feeds[:1], reference, "compile")
    assert [n for n, _ in ok] == [48] * 5
    text = ctx.run.path("debug/bit_exact.txt").read_text()
    assert "outputs of the evaluation's own executor on its batch geometries: 1: kernels" in text
    assert "(32 samples)" in text


@pytest.mark.parametrize("threads", ["1", "2"], ids=["in-turn", "data-parallel"])
def test_a_batch_split_into_samples_gives_quantized_onnx_integers(compiled, monkeypatch, threads):
    """simulator.runtime.split on the compiled tiny model, its batch forced into chunks of
    one sample: through the first runs and each worker's frozen plan, every batch of
    distinct frames gives quantized.onnx's outputs in order."""
    from simulator.runtime import split

    ctx, arts = compiled
    monkeypatch.setattr(split, "SAMPLE_BYTES", 0)
    monkeypatch.setattr(split, "CHUNK_BYTES", 1)
    monkeypatch.setenv("QPARITY_THREADS", threads)
    ex = Executor(hbm.load(ctx.run.path(arts["compile"].hbm_file)))
    x, rng = ctx.evaluation.x[:8], np.random.default_rng(1)
    for _ in range(5):
        xb = x[rng.permutation(len(x))]
        outs, _ = ex.run({"x": xb})
        ref_outs, _ = run_integer(ctx.run.root, arts["convert"], xb)
        assert np.array_equal(next(iter(outs.values())), ref_outs[0])
    assert "batch split: 8 chunks of 1" in ex.last_path
    assert ex.last_path.startswith("frozen plan") == (native.library() is not None)
