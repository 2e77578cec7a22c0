"""Reading XLA's compiled HLO text, for the benches that look at a program without running it
(bench/decode_program.py, bench/train_program.py): its computations and their instructions, how
often each runs (loops by their trip counts), and the bytes a kernel reads and writes."""
from __future__ import annotations

import collections
import math
import re

# The instructions that launch a kernel of their own on a GPU (the rest are fused into them, or free).
KERNELS = ("fusion", "custom-call", "copy", "sort", "scatter", "gather", "reduce", "transpose")


def computations(hlo: str) -> dict[str, list[str]]:
    """Each computation's instruction lines, by name."""
    out, name = {}, None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head:
            name = head.group(1)
            out[name] = []
        elif name and line.startswith("  ") and " = " in line:
            out[name].append(line.strip())
    return out


def opcode(line: str) -> str:
    """The instruction's opcode: the word before the first '(' after the result's type."""
    rhs = line.split(" = ", 1)[1]
    depth, i = 0, 0
    if rhs.startswith("("):  # a tuple type
        for i, ch in enumerate(rhs):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                break
    found = re.match(r"\S*\s+([a-z][\w\-]*)\(", rhs[i + 1:] if rhs.startswith("(") else rhs)
    return found.group(1) if found else "?"


def result_shapes(line: str) -> list[tuple[int, ...]]:
    """The dims of the instruction's result, of each element when it is a tuple."""
    rhs = line.split(" = ", 1)[1]
    depth, end = 0, rhs.find(" ")
    if rhs.startswith("("):
        for end, ch in enumerate(rhs):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                break
    return [tuple(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\w+\[([\d,]*)\]", rhs[:end + 1])]


def condition_bound(comps, line: str) -> int:
    """A loop's trip count read from its condition, `i < N` with one constant N, where the compiler
    does not state it (TPU); 1 when the condition is anything else."""
    cond = comps.get(re.search(r"condition=%?([\w.\-]+)", line).group(1), [])
    bounds = [int(m.group(1)) for text in cond for m in [re.search(r"s32\[\]\S* constant\((\d+)\)", text)] if m]
    return bounds[0] if len(bounds) == 1 and any("direction=LT" in text for text in cond) else 1


def multiplicities(comps, start: str) -> collections.Counter:
    """How many times each computation runs in one run of `start`: a loop body its trip count times
    its caller's count, a fusion's or call's computation as often as the instruction."""
    runs = collections.Counter()

    def visit(name: str, n: int) -> None:
        runs[name] += n
        for line in comps.get(name, []):
            op = opcode(line)
            if op == "while":
                trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
                body = re.search(r"body=%?([\w.\-]+)", line).group(1)
                visit(body, n * (int(trips.group(1)) if trips else condition_bound(comps, line)))
            elif op == "conditional":  # every branch counted: an upper bound
                for branch in re.findall(r"%?([\w.\-]+)", re.search(r"branch_computations=\{([^}]*)\}", line).group(1)):
                    visit(branch, n)
            elif op in ("fusion", "call"):
                visit(re.search(r"(?:calls|to_apply)=%?([\w.\-]+)", line).group(1), n)

    visit(start, 1)
    return runs


DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4}


TRITON = 'custom_call_target="__gpu$xla.gpu.triton"'  # a Pallas (Triton) kernel


def nbytes(type_text: str) -> int:
    """The bytes of a result type's text: an array's, or the sum of a tuple's elements'."""
    return sum(DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", type_text))


def operands(rhs: str) -> list[str]:
    """The instruction names an instruction's right-hand side takes, in order."""
    result = rhs[:rhs.find(")") + 1] if rhs.startswith("(") else rhs.split(" ")[0]
    return re.findall(r"%([\w.\-]+)", rhs[len(result):].split("(", 1)[1].split(")")[0])


def fusion_bytes(lines: list[str], operand_bytes: list[int], result_bytes: int) -> int:
    """Bytes a fusion of computation `lines` reads and writes: each operand whole, but one read only
    by slices or gathers (through bitcasts) at what those take, and one updated in place (the target
    of a dynamic-update-slice or a scatter) not at all, its updates written in place of the whole
    result."""
    params, root, types = {}, {}, {}
    sliced, whole, in_place, updates = collections.Counter(), set(), set(), 0
    for line in lines:
        name, rhs = line.split(" = ", 1)
        name = name.replace("ROOT ", "").lstrip("%")
        types[name] = rhs.split(" ")[0]
        found = re.search(r"parameter\((\d+)\)", rhs)
        if found:
            params[name], root[name] = int(found.group(1)), name
            continue
        op, args = opcode(line), operands(rhs)
        if op == "bitcast" and args and args[0] in root:
            root[name] = root[args[0]]
            continue
        for i, arg in enumerate(args):
            if arg not in root:
                continue
            if i == 0 and op in ("slice", "dynamic-slice", "gather"):
                sliced[root[arg]] += nbytes(types[name])
            elif i == 0 and op in ("dynamic-update-slice", "scatter"):
                in_place.add(root[arg])
                updates += nbytes(types.get(args[1 if op == "dynamic-update-slice" else 2], ""))
            else:
                whole.add(root[arg])
    moved = updates if in_place else result_bytes
    for name, index in params.items():
        if name not in in_place:
            moved += sliced[name] if sliced[name] and name not in whole else operand_bytes[index]
    return moved


def kernels(comps, start: str):
    """(instruction line, its computation's `result_types`, how often it runs) for each kernel one run of
    `start` launches: its own and those of the loop bodies it reaches, loops by their trip counts."""
    runs = multiplicities(comps, start)
    bodies = [re.search(r"body=%?([\w.\-]+)", line).group(1) for caller in runs for line in comps.get(caller, [])
              if opcode(line) == "while"]
    for name in dict.fromkeys([start, *bodies]):  # each once: `runs` already counts every caller
        types = result_types(comps[name])
        for line in comps[name]:
            if opcode(line) in KERNELS:
                yield line, types, runs[name]


def kernel_bytes(comps, line: str, types: dict[str, str]) -> int:
    """Bytes one kernel instruction reads and writes; `types`: the result types of its computation's
    instructions, by name. A fusion's by `fusion_bytes`, anything else its operands and result whole."""
    rhs = line.split(" = ", 1)[1]
    result = nbytes(rhs[:rhs.find(")") + 1] if rhs.startswith("(") else rhs.split(" ")[0])
    sizes = [nbytes(types.get(a, "")) for a in operands(rhs)]
    called = re.search(r"calls=%?([\w.\-]+)", line) if opcode(line) == "fusion" else None
    if called and called.group(1) in comps:
        return fusion_bytes(comps[called.group(1)], sizes, result)
    if TRITON in line:  # a GPU decode kernel takes the stacked cache whole and reads one layer of it at most
        layers = [dims[0] if len(dims) == 5 else 1 for dims in (shape_dims(types.get(a, "")) for a in operands(rhs))]
        sizes = [size // n for size, n in zip(sizes, layers)]
    return result + sum(sizes)


def shape_dims(type_text: str) -> tuple[int, ...]:
    """An array type's dimensions (its text: bf16[36,16,8,6144,128]{...})."""
    found = re.match(r"\w+\[([\d,]*)\]", type_text)
    return tuple(int(d) for d in found.group(1).split(",") if d) if found else ()


def result_types(lines: list[str]) -> dict[str, str]:
    """Each instruction's result type (its text), by name."""
    return {line.split(" = ")[0].replace("ROOT ", "").lstrip("%"): line.split(" = ", 1)[1].split(" ")[0]
            for line in lines}


def entry(hlo: str) -> str:
    """The name of the module's entry computation."""
    return re.search(r"^ENTRY %?([\w.\-]+)", hlo, re.M).group(1)


def graph_launches(thunks: str) -> dict[str, int]:
    """What XLA:GPU's runtime launches from the host, read off its thunk sequence (the dump's
    `*thunk_sequence_after_thunk_passes.txt`, or `*thunk_sequence.txt` where the passes changed
    nothing): `graphs`, the CUDA graphs (command buffers) at any depth; `host_loops`, the while loops
    outside every graph, each of which reads its condition back to the host every step; `host_kernels`,
    the kernels outside every graph, each launched on its own."""
    out = collections.Counter(graphs=0, host_loops=0, host_kernels=0)
    graph_depths: list[int] = []  # the indents of the command buffers the current line is inside
    for line in thunks.splitlines():
        found = re.match(r"^( *)\d+: (k\w+)", line)
        if not found:
            continue  # "condition:", "body:" and blank lines
        depth, kind = len(found.group(1)), found.group(2)
        while graph_depths and depth <= graph_depths[-1]:
            graph_depths.pop()
        if kind == "kCommandBuffer":
            out["graphs"] += 1
            graph_depths.append(depth)
        elif not graph_depths and kind == "kWhile":
            out["host_loops"] += 1
        elif not graph_depths and kind in ("kKernel", "kCustomKernel"):
            out["host_kernels"] += 1
    return dict(out)
