#!/usr/bin/env python3
"""A model of ddo's ring of slots (no GPU, no ddo): one copy engine, one compute stream,
`slots` slots of one unit each, a prefetch window of `slots - 1` units issued at each acquire,
copies in issue order, each waiting for its slot's previous unit to finish computing.
`--homes` takes each unit's slot as vmm_fast_runtime does with a known order (the r-th unit
from the seam in slot r mod slots; a prefetch whose home is busy waits); else the least
recently used free slot (linear_runtime). With `--barrier` (the default) the device drains
after each step, as a bench that synchronizes around each step does.

Units: GGUF Q8_0 Flux.1-dev zero-resident as measured on an H100 (docs/benchmarks.md, sixth
session): the gathered unit (128 MB), 19 double blocks (363 MB, 5.7 ms), 38 single blocks
(150 MB, 3.8 ms), a 6 ms host-bound start; `--pack` pairs the single blocks. The model ignores
the host, contention and the per-acquire cost: it read about 0.06 low against the measured
steps."""

import argparse


def flux_q8(pack):
    units = [(128.0, 0.3)] + [(362.8, 5.7)] * 19
    units += [(301.0, 7.6)] * 19 if pack else [(150.5, 3.8)] * 38
    return units


def ddo_seam(units, slots):
    """The seam as session_prefetch.c places it: the fewest bytes in the 2 x slots units
    around it, nearest the middle on ties, never within a window of the pass boundary."""
    m, k = len(units), slots
    if m <= k or m % k == 0:
        return 0
    lo, hi = (k, m - k) if m > 2 * k else (0, m - 1)
    return min(range(lo, hi + 1),
               key=lambda c: (sum(units[(c + m - k + j) % m][0] for j in range(2 * k)),
                              abs(2 * c - m)))


def step_ms(units, slots, bus_gbps=54.0, host_ms=6.0, barrier=True, homes=False, seam=0,
            steps=4):
    """The last step's length in ms, in steady state."""
    n = len(units)
    copy = [mb / bus_gbps for mb, _ in units]
    slot_unit = [None] * slots
    slot_free = [0.0] * slots
    last = [0] * slots
    loaded = {}  # unit -> (slot, ready time)
    t_copy = t_comp = 0.0
    starts, tick = [], 0

    def place(w, keep, now, own_only):
        nonlocal t_copy
        free = [i for i in range(slots) if slot_unit[i] is None or slot_unit[i] not in keep]
        if homes and own_only:
            i = ((w - seam) % n) % slots
            if i not in free:
                return False
        elif not free:
            return False
        else:
            i = min(free, key=lambda j: (slot_unit[j] is not None, last[j]))
        if slot_unit[i] is not None:
            loaded.pop(slot_unit[i], None)
        t_copy = max(t_copy, now, slot_free[i]) + copy[w]
        slot_unit[i] = w
        loaded[w] = (i, t_copy)
        last[i] = tick
        return True

    for _ in range(steps):
        if barrier:
            t_copy = t_comp = max(t_comp, t_copy)
        starts.append(t_comp)
        t_comp += host_ms
        for p in range(n):
            tick += 1
            keep = [(p + j) % n for j in range(slots)]
            if p not in loaded:
                place(p, keep, t_comp, False)  # on demand: any free slot
            i, ready = loaded[p]
            last[i] = tick
            for j in range(1, slots):
                w = (p + j) % n
                if w not in loaded and not place(w, keep, t_comp, True) and not homes:
                    break
            t_comp = max(t_comp, ready) + units[p][1]
            slot_free[i] = t_comp
    return starts[-1] - starts[-2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, nargs="+", default=[4, 6, 8])
    ap.add_argument("--pack", action="store_true", help="the single blocks in pairs")
    args = ap.parse_args()
    units = flux_q8(args.pack)
    resident = sum(c for _, c in units) + 6.0
    print(f"resident step {resident:.1f} ms; bus bound {sum(mb for mb, _ in units) / 54.0:.1f} ms")
    print("slots  placement            synchronized  back to back  (ratio to the resident step)")
    for k in args.slots:
        for name, kw in (("least recently used", {}), ("homes, seam at 0", {"homes": True}),
                         ("homes, ddo's seam", {"homes": True, "seam": ddo_seam(units, k)})):
            a = step_ms(units, k, **kw) / resident
            b = step_ms(units, k, barrier=False, **kw) / resident
            print(f"{k:5}  {name:21} {a:12.3f}  {b:12.3f}")


if __name__ == "__main__":
    main()
