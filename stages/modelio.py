"""Float and QAT models: build from a spec, export, prepare, save and rebuild without pickle.

A QAT model is never pickled: it is rebuilt from the spec (factory -> torch.export ->
prepare with the same policy, which is deterministic) and its state_dict is loaded from
safetensors. Everything torch-side that the stages share lives here.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import sys
from collections import Counter
from pathlib import Path

import safetensors.torch
import torch
import torch.fx
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

from schemas.errors import ArtifactError, SpecError, StageError
from schemas.fileio import atomic_save, sha256_bytes
from schemas.paths import checked_file
from stages import libs
from stages.constant_fold import fold_constants
from stages.decompose import decompose_attention, einsum_to_matmul
from stages.fake_quant import QFakeQuantize, quantizers
from stages.functionalize import (
    TRAINING_ONLY_KEY,
    out_of_place,
    remove_training_noise,
    rsub_to_add,
    unbind_to_select,
)
from stages.layers import ID_KEY, OpInfo, assign_layer_ids, classify, is_tensor_node
from stages.loader import import_object
from stages.modes import to_eval
from stages.quantizer import NashQuantizer, QuantPolicy


def build_float(
    factory: str, weights: str | None = None, kwargs: dict | None = None
) -> torch.nn.Module:
    """Call the spec's model factory with ``model.kwargs`` (and load its safetensors
    weights) in eval mode. The weights path is checked first (:mod:`schemas.paths`), so a
    bad one is refused before the factory runs (it may train for minutes)."""
    path = None if weights is None else checked_file(weights, "model.weights")
    fn = import_object(factory, field="model.factory")
    try:
        model = libs.call(fn, **(kwargs or {}))
    except Exception as e:  # user code
        raise StageError(
            f"model factory {factory} raised {type(e).__name__}: {e}",
            where="model.factory",
            hint="run the factory on its own to debug it",
        ) from e
    if not isinstance(model, torch.nn.Module):
        raise SpecError(
            f"{factory} returned {type(model).__name__}, not a torch.nn.Module",
            where="model.factory",
            hint="return the model instance",
        )
    if path is not None:
        load_weights(model, path, field="model.weights")
    return model.eval()


def load_weights(model: torch.nn.Module, path: Path, *, field: str) -> None:
    """Load a safetensors state_dict strictly; errors name the file and the keys."""
    try:
        state = safetensors.torch.load_file(str(path))
    except (OSError, safetensors.SafetensorError) as e:
        raise ArtifactError(
            f"cannot read safetensors file {path} ({e})",
            where=field,
            hint="point to a file written by safetensors.torch.save_file",
        ) from e
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ArtifactError(
            f"{path} does not fit the model: missing {result.missing_keys[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}",
            where=field,
            hint="use weights saved from the same model architecture",
        )


def save_state(model: torch.nn.Module, path: Path) -> None:
    """state_dict -> safetensors (tensors made contiguous and unshared)."""
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    atomic_save(path, lambda tmp: safetensors.torch.save_file(state, tmp))


def export_graph(
    model: torch.nn.Module, example: torch.Tensor | tuple, mode: str = "eval"
) -> torch.fx.GraphModule:
    """torch.export in ``mode`` ("train": QAT graph, "eval": deploy graph), dynamic batch,
    made functional and deterministic (stages/functionalize.py; what training-only
    randomness was removed is in ``gm.meta[TRAINING_ONLY_KEY]``).

    A failure names the op or line and what to do. Python branches on ``self.training``
    are fixed by the mode, which is how a train-only branch ends up in qat.pt but not in
    the exported deploy graph.
    """
    model.train(mode == "train")
    try:
        args = example if isinstance(example, tuple) else (example,)
        batch = torch.export.Dim("batch")
        ep = torch.export.export(
            model, args, dynamic_shapes=tuple({0: batch} for _ in args), strict=False
        )
    except Exception as e:  # torch.export raises many types; all mean "cannot trace"
        first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise StageError(
            f"torch.export cannot trace the model{_user_line(str(e))}: {first[:300]}",
            where="prepare",
            hint="remove data-dependent Python control flow on tensor values "
            "(use torch.where / torch.cond) or unsupported Python ops "
            "in forward; run with --debug for the full trace",
        ) from e
    gm = ep.module()
    gm.meta[TRAINING_ONLY_KEY] = remove_training_noise(gm)
    fold_constants(gm)
    out_of_place(gm)
    unbind_to_select(gm)
    decompose_attention(gm)
    einsum_to_matmul(gm)
    rsub_to_add(gm)
    return gm


_USER_LINE = re.compile(
    r'File:? "?([^",]+?)"?(?::|, line )(\d+)[^\n]*?(?:code: (.*))?$', re.MULTILINE
)


def _user_line(message: str) -> str:
    """`` at <file>:<line> (<code>)`` of the first frame outside torch in a trace error."""
    for m in _USER_LINE.finditer(message):
        if "/torch/" not in m.group(1) and "/torchao/" not in m.group(1):
            code = f" ({m.group(3).strip()})" if m.group(3) else ""
            return f" at {m.group(1)}:{m.group(2)}{code}"
    return ""


def prepare_qat(
    float_model: torch.nn.Module, example: torch.Tensor, policy: QuantPolicy, mode: str = "train"
) -> tuple[torch.fx.GraphModule, list[OpInfo], dict[str, tuple[str, str]]]:
    """Float model -> QAT GraphModule (BN folded, fake quant per the policy).

    ``mode="train"`` traces the graph QAT trains (qat.pt); ``"eval"`` the deploy graph.
    BN is folded with its running statistics in both, and the module is switched to eval
    behaviour (dropout off) afterwards. Returns the module, its ops with canonical ids, and
    quantizer -> (layer id, role). The float model must be a copy: folding rewrites it.
    """
    gm = export_graph(float_model, example, mode)
    infos = assign_layer_ids(gm)
    if any(not i.supported for i in infos):
        raise UnsupportedOps(infos)
    removed = gm.meta.get(TRAINING_ONLY_KEY, [])
    gm = prepare_pt2e(gm, NashQuantizer(policy))
    gm.meta[TRAINING_ONLY_KEY] = removed
    _keep_ids(gm, to_eval)
    _forget_device_caches()
    return gm, infos, name_quantizers(gm)


def _forget_device_caches() -> None:
    """Empty torch's and torchao's ``functools.cache`` of a module's device, keyed by the
    module: every graph prepare_pt2e saw (ResNet-50@224: 152 MB of weights) stayed alive
    to the end of the process through them."""
    from torch.ao.quantization.fx import utils as fx_utils
    from torchao import utils as ao_utils

    for fn in (fx_utils.assert_and_get_unique_device, ao_utils._assert_and_get_unique_device):
        fn.cache_clear()


def _keep_ids(gm: torch.fx.GraphModule, rewrite) -> None:
    """Run a torchao graph rewrite, then give back the ids of nodes it replaced.

    The eval rewrite replaces batch_norm / dropout nodes without their meta; a replacement
    is found by the op it computes and the nodes it reads (all of them: LeViT's two head
    batch norms read one input and differ only in their weights).
    """
    before = {_reads(n): n.meta[ID_KEY] for n in gm.graph.nodes if ID_KEY in n.meta and n.args}
    rewrite(gm)
    for n in gm.graph.nodes:
        if ID_KEY not in n.meta and is_tensor_node(n) and n.args:
            lid = before.get(_reads(n))
            if lid:
                n.meta[ID_KEY] = lid


def _reads(n: torch.fx.Node) -> tuple:
    """(op, names of the nodes among its arguments): what identifies a rewritten node."""
    return (classify(n)[0], *(a.name for a in n.args if isinstance(a, torch.fx.Node)))


def load_qat(art, ctx) -> torch.fx.GraphModule:
    """Rebuild the QAT model of an artifact in this run and load its saved state."""
    gm, _, _ = ctx.prepared_qat()
    state_file = ctx.run.path(art.state_file)
    load_weights(gm, state_file, field=f"artifact {art.state_file}")
    name_quantizers(gm)
    return gm


class UnsupportedOps(StageError):
    """The model uses ops qparity cannot carry through the chain (``infos``: all ops)."""

    def __init__(self, infos: list[OpInfo]):
        self.infos = infos
        bad = [i for i in infos if not i.supported]
        first: dict[str, OpInfo] = {}
        for o in bad:
            first.setdefault(o.target, o)
        count = Counter(o.target for o in bad)
        listing = "; ".join(
            f"{t} at node {o.node} (layer {o.layer_id}"
            + (f", {o.source}" if o.source else "")
            + (f"; {count[t] - 1} more node(s) of it" if count[t] > 1 else "")
            + ")"
            for t, o in first.items()
        )
        super().__init__(
            f"{len(bad)} unsupported op(s): {listing}",
            where="prepare",
            hint="replace them with supported ops (docs/design.md 'Op coverage'); "
            "debug/model_check_result.txt lists them",
        )


def name_quantizers(gm: torch.fx.GraphModule) -> dict[str, tuple[str, str]]:
    """Quantizer module name -> (layer id, role in {input, weight, output})."""
    roles = {}
    for node in gm.graph.nodes:
        if node.op != "call_module" or not isinstance(gm.get_submodule(node.target), QFakeQuantize):
            continue
        src = node.args[0]
        if src.op == "get_attr":
            user = next(iter(node.users))
            roles[node.target] = (user.meta.get(ID_KEY, user.name), "weight")
        elif src.op == "placeholder":
            roles[node.target] = (f"input:{src.name}", "input")
        else:
            roles[node.target] = (src.meta.get(ID_KEY, src.name), "output")
    for name, fq in quantizers(gm):
        layer, role = roles.get(name, (name, "output"))
        fq.name = f"{layer}[{role}]"
    return roles


def model_digest(model: torch.nn.Module, factory: str, kwargs: dict | None = None) -> str:
    """sha256 over the state_dict tensors, the factory's keyword arguments and the source
    files of the factory's module and of every module class the model is made of (a
    ``forward`` edited in a helper module changes the graph but no weight)."""
    h = hashlib.sha256(json.dumps(kwargs or {}, sort_keys=True, default=str).encode())
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    for source in _model_sources(model, factory.partition(":")[0]):
        h.update(source.encode() + b"\0" + Path(source).read_bytes())
    return h.hexdigest()


def _model_sources(model: torch.nn.Module, factory_module: str) -> list[str]:
    """The source files of ``factory_module`` and of each submodule's class, sorted."""
    names = {factory_module} | {type(m).__module__ for m in model.modules()}
    found = {module_source(sys.modules.get(name)) for name in names}
    return sorted(found - {None})


def module_source(module) -> str | None:
    """The source file of ``module`` (None for None, a built-in or a module without one)."""
    try:
        source = inspect.getsourcefile(module) if module else None
    except TypeError:  # a built-in module has no source file
        return None
    return source if source and Path(source).is_file() else None


def source_digest(obj) -> str | None:
    """Digest of the source file of ``obj``'s module (None: it has none): what a spec's
    user function (``data.metric``) computed must not be reused after an edit of it."""
    source = module_source(inspect.getmodule(obj))
    return sha256_bytes(Path(source).read_bytes()) if source else None


def attr_tensor(gm: torch.nn.Module, target: str) -> torch.Tensor:
    """The tensor a get_attr node names (a dotted path of attributes)."""
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
