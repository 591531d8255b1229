"""Bad fault specs of the localizer's own proof for the catalog
(tests/catalog/test_bad_inputs.py): a calibrate fault that names a layer the model does not
have, or one without an output quantizer to rescale.

Each case runs the tiny chain in the scratch folder: the complete run is never changed.
"""

from __future__ import annotations

import yaml

from schemas.errors import SpecError


def _calib_scale(env, layer: str):
    from pipelines.flow import run_chain
    from schemas.spec import parse_spec
    from tests.conftest import tiny_spec_dict

    data = tiny_spec_dict(
        faults=[{"kind": "calib_scale", "layer": layer, "amount": -8}],
        stages={"stop_after": "calibrate"},
    )
    spec = parse_spec(data, "t")
    return run_chain(spec, yaml.safe_dump(data), env.tmp / "faulted", use_prefect=False)


def cases() -> dict:
    return {
        "calib_scale on a missing layer": (lambda e: _calib_scale(e, "nothere"), SpecError,
                                           "nothere"),
        "calib_scale on a layer without output scale": (lambda e: _calib_scale(e, "reshape"),
                                                         SpecError, "reshape"),
    }  # fmt: skip
