"""The fake-quant module qparity inserts into torchao PT2E graphs, and its state machine.

:class:`QFakeQuantize` is a torchao ``FakeQuantizeBase``, so ``prepare_pt2e`` inserts it
(``QFakeQuantize.with_args(...)`` as a ``QuantizationSpec``'s ``observer_or_fake_quant_ctr``)
and ``convert_pt2e`` reads its ``calculate_qparams``. The arithmetic is
:func:`simulator.arith.fixedpoint.fake_quantize` (one implementation for torch and the simulator).

States, like the vendor's ``FakeQuantState`` (observer / fake quant):

- ``CALIBRATION``: observe, return x;
- ``VALIDATION``: fake quant with the frozen scale;
- ``QAT``: observe, recompute the scale every forward, fake quant, straight-through grads;
- ``FLOAT``: return x.

The state is mirrored in torchao's ``observer_enabled``/``fake_quant_enabled`` buffers (the
pairs are a bijection), so torchao's ``enable_observer``/``disable_fake_quant`` helpers move
the state and printing a model shows the truth.
"""

from __future__ import annotations

import enum

import torch
from torch import nn
from torchao.quantization.pt2e.fake_quantize import FakeQuantizeBase

from schemas.errors import SimulatorError, StageError
from simulator.arith import fixedpoint
from stages.observers import make_observer


class QuantState(enum.IntEnum):
    """Quantizer state; the value is what ``state_code`` stores."""

    FLOAT = 0
    CALIBRATION = 1
    VALIDATION = 2
    QAT = 3

    @classmethod
    def parse(cls, state: QuantState | str | int) -> QuantState:
        """A state from itself, its name (any case) or its code."""
        try:
            return cls[state.upper()] if isinstance(state, str) else cls(state)
        except (KeyError, ValueError):
            names = ", ".join(s.name.lower() for s in cls)
            raise StageError(f"unknown quantizer state {state!r}", hint=f"use {names}") from None


# state -> (observer_enabled, fake_quant_enabled)
_FLAGS = {
    QuantState.FLOAT: (0, 0),
    QuantState.CALIBRATION: (1, 0),
    QuantState.VALIDATION: (0, 1),
    QuantState.QAT: (1, 1),
}
_BY_FLAGS = {flags: state for state, flags in _FLAGS.items()}
_DTYPES = {torch.int8: "int8", torch.qint8: "int8", torch.int16: "int16", torch.int32: "int32"}
_QSCHEMES = (torch.per_tensor_symmetric, torch.per_channel_symmetric)
QAT_OBSERVERS = ("minmax", "moving_average_minmax")
"""Observers that also serve QAT; others hand QAT to a moving-average minmax observer."""


def _qdtype(dtype: torch.dtype | str) -> str:
    """torch dtype (or name) -> the simulator's dtype name."""
    name = dtype if isinstance(dtype, str) else _DTYPES.get(dtype)
    if name not in fixedpoint.QRANGES:
        raise StageError(f"unsupported quantized dtype {dtype}", hint="use torch.int8 or int16")
    return name


class QFakeQuantize(FakeQuantizeBase):
    """Symmetric fake quant (zero point 0) for the modelled Nash BPU.

    FORMULA: ``clamp(round(x / s), qmin, qmax) * s`` with ``round`` = ``rounding``
    (``half_even`` | ``bpu_round``) and ``s = symmetric_scale(observer.amax(), dtype)``,
    then ``pot_scale(s)`` if ``pot``. Per channel (``ch_axis``) ``s`` has shape [C].

    Our ``with_args`` kwargs: ``observer`` (kind), ``rounding``, ``pot``, ``ch_axis``,
    ``percentile``, ``averaging_constant``. torchao's kwargs (``dtype``, ``quant_min``,
    ``quant_max``, ``qscheme``, ``is_dynamic``) are checked; unknown ones are ignored.

    QAT observes with minmax, as the vendor does: a ``minmax`` or ``moving_average_minmax``
    observer keeps observing; a ``percentile``/``mse`` quantizer hands QAT to
    ``qat_observer`` (moving-average minmax, per tensor), seeded with the calibrated range
    ``+-scale * (qmax - qmin) / 2`` so QAT starts from the calibrated scale.
    torchao drops the spec's ``ch_axis`` for this class, so a per-channel qscheme without
    ``ch_axis`` means axis 0 (the output channel of conv and linear weights).
    """

    def __init__(
        self,
        observer: str = "minmax",
        rounding: str = "half_even",
        pot: bool = False,
        ch_axis: int | None = None,
        percentile: float = 99.99,
        averaging_constant: float = 0.01,
        dtype: torch.dtype | str = torch.int8,
        quant_min: int | None = None,
        quant_max: int | None = None,
        qscheme: torch.qscheme | None = None,
        is_dynamic: bool = False,
        **_torchao_kwargs: object,
    ):
        super().__init__()
        self.name = ""
        self.qdtype = _qdtype(dtype)
        self.dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, self.qdtype)
        self.quant_min, self.quant_max = self._check_range(quant_min, quant_max)
        self.qscheme, self.ch_axis = self._check_scheme(qscheme, ch_axis, is_dynamic)
        if rounding not in fixedpoint.ROUNDING_MODES:
            raise StageError(f"unknown rounding {rounding!r}", hint="half_even or bpu_round")
        self.rounding, self.pot, self.observer_kind = rounding, bool(pot), observer
        self.is_dynamic = False
        self.observer, self.qat_observer = self._make_observers(
            observer, percentile=percentile, averaging_constant=averaging_constant
        )
        self.register_buffer("observed_in_qat", torch.zeros(1, dtype=torch.uint8))
        self.register_buffer("scale", torch.zeros(1))  # 0 = not frozen yet
        self.register_buffer("zero_point", torch.zeros(1, dtype=torch.int32))
        self.register_buffer("state_code", torch.tensor([int(QuantState.CALIBRATION)]))
        self.set_state(QuantState.CALIBRATION)

    def _make_observers(self, kind: str, **kwargs) -> tuple[nn.Module, nn.Module | None]:
        """The calibration observer and, unless it is minmax-type, the QAT one."""
        observer = make_observer(
            kind, ch_axis=self.ch_axis, dtype=self.qdtype, rounding=self.rounding, **kwargs
        )
        if kind in QAT_OBSERVERS:
            return observer, None  # the vendor uses minmax in QAT: ours already is
        qat = make_observer(
            "moving_average_minmax", averaging_constant=kwargs["averaging_constant"]
        )
        return observer, qat

    def _check_range(self, quant_min: int | None, quant_max: int | None) -> tuple[int, int]:
        qmin, qmax = fixedpoint.qrange(self.qdtype)
        if (quant_min, quant_max) not in ((None, None), (qmin, qmax)):
            raise StageError(
                f"quant range [{quant_min}, {quant_max}] is not the full {self.qdtype} range",
                hint=f"the BPU is symmetric over [{qmin}, {qmax}]; use that range",
            )
        return qmin, qmax

    @staticmethod
    def _check_scheme(qscheme, ch_axis: int | None, is_dynamic: bool):
        if qscheme is None:
            qscheme = _QSCHEMES[ch_axis is not None]
        if qscheme not in _QSCHEMES or is_dynamic:
            raise StageError(
                f"unsupported qscheme {qscheme} (is_dynamic={is_dynamic})",
                hint="the BPU is static and symmetric: per_tensor/per_channel_symmetric",
            )
        if qscheme == torch.per_tensor_symmetric and ch_axis is not None:
            raise StageError(f"per-tensor qscheme with ch_axis={ch_axis}")
        if qscheme == torch.per_channel_symmetric and ch_axis is None:
            ch_axis = 0
        return qscheme, ch_axis

    # -- state ------------------------------------------------------------------------
    @property
    def state(self) -> QuantState:
        return QuantState(int(self.state_code[0]))

    def set_state(self, state: QuantState | str) -> None:
        """Switch state; torchao's ``observer_enabled``/``fake_quant_enabled`` follow."""
        state = QuantState.parse(state)
        self.state_code[0] = int(state)
        self.observer_enabled[0], self.fake_quant_enabled[0] = _FLAGS[state]

    def enable_observer(self, enabled: bool = True) -> None:
        self.set_state(_BY_FLAGS[(int(enabled), int(self.fake_quant_enabled[0]))])

    def enable_fake_quant(self, enabled: bool = True) -> None:
        self.set_state(_BY_FLAGS[(int(self.observer_enabled[0]), int(enabled))])

    def _observe(self, x: torch.Tensor, qat: bool) -> None:
        """Feed the observer of this state; remember which one holds the latest stats."""
        fresh = self.qat_observer is not None and not self.qat_observer.has_data
        if qat and fresh and self.is_frozen:  # start QAT from the calibrated range
            amax = self.scale * (self.quant_max - self.quant_min) / 2
            self.qat_observer(torch.cat([-amax, amax]))
        self.observed_in_qat[0] = int(qat)
        self._stats_observer()(x)

    def _stats_observer(self) -> nn.Module:
        """The observer whose statistics define the scale now."""
        if bool(self.observed_in_qat[0]) and self.qat_observer is not None:
            return self.qat_observer
        return self.observer

    # -- scale ------------------------------------------------------------------------
    @property
    def is_frozen(self) -> bool:
        return bool((self.scale > 0).all())

    def freeze(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Scale from the observer: ``symmetric_scale(amax, dtype)``, then ``pot_scale``."""
        where = f"quantizer {self.name}".rstrip()
        observer = self._stats_observer()
        if not observer.has_data:
            raise StageError(
                f"{where} saw no calibration data",
                hint="run calibration batches through the model in CALIBRATION state first",
            )
        try:
            scale = fixedpoint.symmetric_scale(observer.amax(), self.qdtype)
            scale = fixedpoint.pot_scale(scale) if self.pot else scale
        except SimulatorError as e:
            raise StageError(f"{where}: scale is NaN or invalid ({e.what})", hint=e.hint) from e
        self.scale.resize_(scale.shape).copy_(scale)
        self.zero_point.resize_(scale.shape).zero_()
        return self.scale, self.zero_point

    def calculate_qparams(self, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, zero_point)``: live from the observer while it observes, else frozen."""
        if bool(self.observer_enabled[0]) or not self.is_frozen:
            return self.freeze()
        return self.scale, self.zero_point

    # -- forward ----------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = self.state
        if state == QuantState.FLOAT:
            return x
        if state in (QuantState.CALIBRATION, QuantState.QAT):
            self._observe(x, qat=state == QuantState.QAT)
        if state == QuantState.CALIBRATION:
            return x
        if state == QuantState.QAT:
            self.freeze()
        elif not self.is_frozen:
            raise StageError(
                f"quantizer {self.name} has no frozen scale in VALIDATION state",
                hint="calibrate, then call freeze_model(model) before validating",
            )
        return self._fake_quant(x, straight_through=state == QuantState.QAT)

    def _fake_quant(self, x: torch.Tensor, straight_through: bool) -> torch.Tensor:
        """fixedpoint.fake_quantize; in QAT grad 1 where round(x/s) is in range, else 0."""
        scale = self.scale.to(x.dtype)
        fq = fixedpoint.fake_quantize(x.detach(), scale, self.qdtype, self.rounding, self.ch_axis)
        if not straight_through or not x.requires_grad:
            return fq
        if self.ch_axis is not None:
            shape = [1] * x.ndim
            shape[self.ch_axis] = -1
            scale = scale.reshape(shape)
        q = fixedpoint.round_by(x.detach() / scale, self.rounding)
        inside = (q >= self.quant_min) & (q <= self.quant_max)
        return fq + (x - x.detach()) * inside

    # -- persistence and printing -----------------------------------------------------
    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("scale", "zero_point"):
            if prefix + name in state_dict:
                getattr(self, name).resize_(state_dict[prefix + name].shape)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        values = ", ".join(f"{v:.6g}" for v in self.scale[:4].tolist())
        more = f", ... ({self.scale.numel()} values)" if self.scale.numel() > 4 else ""
        return (
            f"state={self.state.name}, fake_quant_enabled={int(self.fake_quant_enabled[0])}, "
            f"observer_enabled={int(self.observer_enabled[0])}, dtype={self.qdtype}, "
            f"quant_min={self.quant_min}, quant_max={self.quant_max}, qscheme={self.qscheme}, "
            f"ch_axis={self.ch_axis}, rounding={self.rounding}, pot={self.pot}, "
            f"scale=[{values}{more}]"
        )


def quantizers(model: nn.Module) -> list[tuple[str, QFakeQuantize]]:
    """Every QFakeQuantize in ``model`` with its module path.

    A quantizer without a ``.name`` gets its module path as name; a name a caller already
    gave (e.g. ``"layer1.conv[weight]"``) is kept.
    """
    found = []
    for name, module in model.named_modules():
        if isinstance(module, QFakeQuantize):
            module.name = module.name or name
            found.append((name, module))
    return found


def set_model_state(model: nn.Module, state: QuantState | str) -> int:
    """Put every quantizer of ``model`` in ``state``; returns how many there are."""
    found = quantizers(model)
    for _, q in found:
        q.set_state(state)
    return len(found)


def freeze_model(model: nn.Module) -> int:
    """Freeze every quantizer's scale from its observer; returns how many there are."""
    found = quantizers(model)
    for _, q in found:
        q.freeze()
    return len(found)
