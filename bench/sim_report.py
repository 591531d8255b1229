"""The report of bench/simulator.py: its table, the targets (each ratio against its named
anchor: torch fp32 eager, ORT on qat.onnx, ORT int8) and where the simulator's time went."""

from __future__ import annotations

TARGETS = (("sim >= 2x torch fp32 eager", "sim/torch", 2.0),
           ("sim >= 0.5x ORT", "sim/ORT", 0.5),
           ("sim >= 1.5x ORT int8", "sim/ORT int8", 1.5))  # fmt: skip


def _fmt_fps(v):
    return f"{v:,.1f}" if v is not None else "n/a"


def _fmt_ratio(v):
    return f"{v:.2f}x" if v is not None else "n/a"


def print_table(rows: list) -> None:
    """The markdown table and the targets, each ratio against its named anchor."""
    header = ("model", "batch", "sim fps", "torch fp32 fps", "ORT fps (qat.onnx)",
              "ORT int8 fps", "sim/torch", "sim/ORT", "sim/ORT int8",
              "busy cores (others)")  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for name, batch, sim, tor, ort, load, int8 in rows:
        ratios = [sim / ref if sim and ref else None for ref in (tor, ort, int8)]
        cells = (name, str(batch), *map(_fmt_fps, (sim, tor, ort, int8)),
                 *map(_fmt_ratio, ratios), f"{load:.2f}")  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    print("\nTargets (from the issue; reported, not asserted):")
    for label, _, goal in TARGETS:
        for name, batch, sim, tor, ort, _, int8 in rows:
            ref = tor if "torch" in label else int8 if "int8" in label else ort
            what = f"{name} b{batch}"
            if sim is None or ref is None:
                why = "no simulator number" if sim is None else "no ORT number"
                print(f"  {label:<28} {what:<16} n/a ({why})")
                continue
            ratio = sim / ref
            print(f"  {label:<28} {what:<16} {ratio:6.2f}x  {'PASS' if ratio >= goal else 'MISS'}")


def print_splits(splits: dict) -> None:
    """Where the simulator's time went, per model and batch (slowest ops, instructions)."""
    for (name, batch), (split, program, sim_s, anatomy) in splits.items():
        ops, total = split["ops"], sum(split["ops"].values())
        print(f"\nSimulator time by op, {name} (batch {batch}; median per op over the timed "
              f"rounds, {total * 1e3:.1f} ms summed, {sim_s * 1e3:.1f} ms median run):")  # fmt: skip
        for op, s in sorted(ops.items(), key=lambda kv: -kv[1]):
            print(f"  {op:<12} {s * 1e3:9.1f} ms  {100 * s / total:5.1f}%")
        kinds = by_kind(split["instrs"], program)
        print("  by instruction kind (depthwise / 1x1 / kxk convs, fused adds, layout moves):")
        for kind, s in sorted(kinds.items(), key=lambda kv: -kv[1]):
            print(f"    {kind:<24} {s * 1e3:9.2f} ms  {100 * s / total:5.1f}%")
        print(f"    {'outside the instructions':<24} {max(sim_s - total, 0.0) * 1e3:9.2f} ms  "
              "(the median run minus the summed instructions)")  # fmt: skip
        if "batch split" in split.get("path", ""):
            print("  (a batch split: the seconds above are the chunks the calling thread ran, "
                  "summed; another worker ran the rest beside them, so the run minus them is "
                  "not overhead)")  # fmt: skip
        print("  slowest instructions:")
        for i, s in sorted(split["instrs"].items(), key=lambda kv: -kv[1])[:6]:
            ins = program.instructions[i]
            shape = ",".join(ins.layer_ids)[:60]
            print(f"    #{i:<3} {ins.op.value:<8} {s * 1e3:8.1f} ms  {shape}")
        if anatomy:
            tot = sum(anatomy.values())
            print(f"  inside the conv instructions ({tot * 1e3:.1f} ms, re-timed step by step):")
            for k, v in anatomy.items():
                print(f"    {k:<40} {v * 1e3:8.1f} ms  {100 * v / tot:5.1f}%")


def instruction_kind(ins, program) -> str:
    """A label finer than the op for the time split: ``conv depthwise``, ``conv 1x1``,
    ``conv 3x3`` (``+ add`` when a residual add is fused), ``layout ToNHWC``, or the op."""
    op = ins.op.value
    if op == "layout":
        return f"layout {ins.attrs.get('op_type', '')}".strip()
    if op != "conv":
        return op
    w = program.constants[ins.consts[0]]
    group = int(ins.attrs.get("group") or 1)
    nhwc = ins.attrs.get("layout") == "nhwc"  # weights [O, kh, kw, C]; plain: [O, C, kh, kw]
    kh, kw = (w.shape[1:3] if nhwc else w.shape[2:4]) if w.ndim == 4 else (1, w.shape[-1])
    kind = "conv depthwise" if group > 1 and group == w.shape[0] else f"conv {kh}x{kw}"
    return kind + (" + add" if len(ins.inputs) > 1 else "")


def by_kind(instrs: dict[int, float], program) -> dict[str, float]:
    """Seconds per :func:`instruction_kind` from seconds per instruction index."""
    out: dict[str, float] = {}
    for i, s in instrs.items():
        kind = instruction_kind(program.instructions[i], program)
        out[kind] = out.get(kind, 0.0) + s
    return out
