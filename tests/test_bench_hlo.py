"""bench/hlo.py: the bytes a fusion moves, read from its computation as XLA:GPU prints it: an operand read
only through slices or gathers (behind bitcasts) at what those take, an in-place update at its update,
anything else whole."""
from tests.scripts import load_script

hlo = load_script("bench/hlo.py")

CACHE, TABLE = 4 * 8 * 64 * 16 * 2, 1000 * 32 * 2  # bf16[4,8,64,16], bf16[1000,32]


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines()]


def test_a_cache_updated_in_place_behind_a_bitcast_moves_its_update_only():
    lines = _lines("""
      %param_0 = bf16[4,8,16,64]{2,3,1,0} parameter(0)
      %bitcast.1 = bf16[4,8,64,16]{3,2,1,0} bitcast(%param_0)
      %param_1 = bf16[1,8,1,16]{3,2,1,0} parameter(1)
      %param_2 = s32[] parameter(2)
      ROOT %dynamic-update-slice.1 = bf16[4,8,64,16]{3,2,1,0} dynamic-update-slice(%bitcast.1, %param_1, %param_2, %param_2, %param_2, %param_2)
    """)
    update = 8 * 16 * 2
    assert hlo.fusion_bytes(lines, [CACHE, update, 4], CACHE) == update + update + 4  # written, read, index


def test_an_embedding_lookup_reads_the_rows_it_gathers():
    lines = _lines("""
      %param_0 = bf16[1000,32]{1,0} parameter(0)
      %param_1 = s32[2,1]{1,0} parameter(1)
      %gather.1 = bf16[2,1,32]{2,1,0} gather(%param_0, %param_1), offset_dims={1,2}, slice_sizes={1,32}
      ROOT %convert.1 = f32[2,1,32]{2,1,0} convert(%gather.1)
    """)
    assert hlo.fusion_bytes(lines, [TABLE, 8], 2 * 32 * 4) == 2 * 32 * 2 + 8 + 2 * 32 * 4


def test_an_operand_also_read_whole_counts_whole():
    lines = _lines("""
      %param_0 = bf16[1000,32]{1,0} parameter(0)
      %slice.1 = bf16[1,32]{1,0} slice(%param_0), slice={[0:1], [0:32]}
      %reduce.1 = bf16[32]{0} reduce(%param_0, %c), dimensions={0}, to_apply=%add
      ROOT %add.1 = bf16[1,32]{1,0} add(%slice.1, %reduce.1)
    """)
    assert hlo.fusion_bytes(lines, [TABLE], 64) == TABLE + 64


def test_a_scatter_into_a_cache_in_place_moves_its_updates_only():
    lines = _lines("""
      %param_0 = bf16[4,8,64,16]{3,2,1,0} parameter(0)
      %param_1 = s32[4,1]{1,0} parameter(1)
      %param_2 = bf16[4,8,16]{2,1,0} parameter(2)
      %bitcast.2 = bf16[4,1,8,1,16]{4,3,2,1,0} bitcast(%param_2)
      ROOT %scatter.1 = bf16[4,8,64,16]{3,2,1,0} scatter(%param_0, %param_1, %bitcast.2), update_window_dims={1,2,3,4}
    """)
    rows = 4 * 8 * 16 * 2  # each row's new key, one slot of its own
    assert hlo.fusion_bytes(lines, [CACHE, 16, rows], CACHE) == rows + 16 + rows  # written, indices, read


def test_a_gpu_decode_kernel_reads_one_layer_of_the_stacked_cache_at_most():
    """A Pallas (Triton) kernel takes the stacked cache [layers, rows, KV, slots, head_dim] whole and
    reads one layer of it at most; its other operands and its results count whole."""
    cache = "bf16[36,16,8,6144,128]{4,3,2,1,0}"
    types = {"q": "bf16[16,8,16,128]{3,2,1,0}", "k": cache, "v": cache, "m": "s8[16,6144]{1,0}"}
    line = ('%pallas_call.4 = (f32[16,8,2,16,128]{4,3,2,1,0}, f32[16,8,2,16]{3,2,1,0}) custom-call(%q, %k, %v, %m), '
            'custom_call_target="__gpu$xla.gpu.triton"')
    layer, q, mask, out = 16 * 8 * 6144 * 128 * 2, 16 * 8 * 16 * 128 * 2, 16 * 6144, 16 * 8 * 2 * 16 * 129 * 4
    assert hlo.kernel_bytes({}, line, types) == 2 * layer + q + mask + out
    other = line.replace("__gpu$xla.gpu.triton", "cublas")  # any other custom call: its operands whole
    assert hlo.kernel_bytes({}, other, types) == 2 * 36 * layer + q + mask + out


def test_graph_launches_count_what_runs_outside_cuda_graphs():
    # Laid out as XLA:GPU dumps its thunks: a loop whose body is one graph (its condition a kernel on
    # its own), then a kernel on its own.
    body_in_a_graph = """
000: kCommandBuffer [source | next=002 (1)]
    001: kCustomKernel [source | sink] input_reduce_fusion grid: [1, 1, 1]
002: kWhile         [prev=000 (1) | next=007 (1)]
condition:
    003: kCustomKernel [source | sink] loop_and_fusion grid: [1, 1, 1]
  body:
    000: kCommandBuffer [source | sink]
        004: kCustomKernel [source | next=005 (1)] fusion_1 grid: [128, 1, 1]
        005: kCustomKernel [prev=004 (1) | sink] fusion_2 grid: [128, 1, 1]
007: kCustomKernel [prev=002 (1) | sink] loop_add_fusion grid: [1, 1, 1]
"""
    assert hlo.graph_launches(body_in_a_graph) == {"graphs": 2, "host_loops": 1, "host_kernels": 2}
    # The same loop inside one graph: nothing left to the host.
    whole = "000: kCommandBuffer [source | sink]\n" + "\n".join(
        "    " + line for line in body_in_a_graph.strip().splitlines()[2:-1])
    assert hlo.graph_launches(whole) == {"graphs": 2, "host_loops": 0, "host_kernels": 0}
    # No graph at all: the body's kernels launch one by one.
    bare = "\n".join(line for line in body_in_a_graph.splitlines() if "kCommandBuffer" not in line)
    assert hlo.graph_launches(bare) == {"graphs": 0, "host_loops": 1, "host_kernels": 5}
