"""Run a prefix of the chain with plain function calls (no Prefect, no cache)."""

from stages.registry import BY_NAME
from stages.registry_types import StageCall

H = "0" * 64


def run_stages(ctx, *names):
    """Call the named stages in order, saving each artifact; returns {name: artifact}."""
    arts, art = {}, None
    for name in names:
        art = BY_NAME[name].fn(art, ctx, StageCall(name, H, H, "test"))
        ctx.run.save_artifact(art)
        arts[name] = art
    return arts
