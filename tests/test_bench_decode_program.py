"""bench/decode_program.py's reading of compiled HLO, on hand-written programs shaped as XLA:GPU and
the TPU compiler print them: the kernels a decode step launches, layer loops multiplied out, and the
copies it names (of the KV cache, of weights out of a stack), but never the in-place cache writes."""
from tests.scripts import load_script

bench = load_script("bench/decode_program.py")

CACHE = "bf16[28,32,8,1280,128]{4,3,2,1,0}"
GPU = f"""
%layer_cond (p: (s32[])) -> pred[] {{
  %lt = pred[] compare(%a, %b), direction=LT
}}

%layer_body (p: (s32[], {CACHE})) -> (s32[], {CACHE}) {{
  %loop_dynamic_update_slice_fusion.2 = {CACHE} fusion(%c, %k, %i), kind=kLoop, calls=%fused_dus
  %wrapped_slice.3 = bf16[1,32,8,1280,128]{{4,3,2,1,0}} fusion(%loop_dynamic_update_slice_fusion.2), kind=kLoop
  %gemm_fusion_dot.4 = bf16[256,2,128]{{2,1,0}} fusion(%p, %wrapped_slice.3), kind=kCustom
  %loop_dynamic_slice_fusion.5 = bf16[1,2560,9728]{{2,1,0}} fusion(%w, %i), kind=kCustom
  %loop_dynamic_slice_fusion.6 = bf16[1,2560]{{1,0}} fusion(%norm, %i), kind=kCustom
  %wrapped_slice.9 = bf16[1,32,128,2560]{{3,2,1,0}} fusion(%o), kind=kLoop
  %loop_dynamic_slice_fusion.7 = (bf16[1,2,8,6144,128]{{4,3,2,1,0}}, bf16[1,2,8,6144,128]{{4,3,2,1,0}}) fusion(%c, %i), kind=kCustom
}}

%step_body (p: (s32[], {CACHE})) -> (s32[], {CACHE}) {{
  %while.1 = (s32[], {CACHE}) while(%t), condition=%layer_cond, body=%layer_body, backend_config={{"known_trip_count":{{"n":"28"}}}}
  %input_reduce_fusion.8 = f32[32,151936]{{1,0}} fusion(%h, %e), kind=kInput
}}
"""
TPU = f"""
%wide.cond (arg: (s32[], {CACHE})) -> pred[] {{
  %constant.3570 = s32[]{{:T(128)}} constant(28)
  %gte = s32[]{{:T(128)}} get-tuple-element(%arg), index=0
  ROOT %lt.420 = pred[]{{:T(512)}} compare(%gte, %constant.3570), direction=LT
}}

%wide.body (arg: (s32[], {CACHE})) -> (s32[], {CACHE}) {{
  %bitcast_dynamic-update-slice_fusion.4 = {CACHE} fusion(%c, %s), kind=kOutput
  %constant_dynamic-slice_fusion.38 = bf16[1,32,8,1280,128]{{4,1,2,3,0:T(8,128)(2,1)}} fusion(%c, %s), kind=kLoop, backend_config={{"window_config":{{"estimated_cycles":"300"}}}}
  %multiply_select_fusion.4 = f32[32,8,2,1280]{{3,2,1,0:T(2,128)}} fusion(%q, %constant_dynamic-slice_fusion.38), kind=kOutput, backend_config={{"window_config":{{"estimated_cycles":"100","iteration_bounds":["1"]}}}}
  %closed_call.25 = bf16[32,1,16,128]{{3,2,1,0:T(8,128)(2,1)}} custom-call(%q, %c), custom_call_target="tpu_custom_call"
  %copy.102 = bf16[28,32,8,1280,128]{{4,3,2,1,0:T(8,128)(2,1)}} copy(%scatter_fusion), metadata={{op_name="scatter"}}
  %copy.7 = bf16[32,1,16,64]{{3,2,0,1:T(8,128)(2,1)}} copy(%q)
}}

%decode_body (arg: (s32[], {CACHE})) -> (s32[], {CACHE}) {{
  %while.111 = (s32[]{{:T(128)}}, {CACHE}) while(%t), condition=%wide.cond, body=%wide.body
}}
"""


def test_gpu_step_counts_the_layer_loop_and_names_its_copies():
    comps = bench.computations(GPU)
    count = bench.step_kernels(comps, "step_body")
    # Per layer: the cache write (in place, a plain fusion), the value window copy, the gemm, a weight
    # copied out of its stack by a dynamic slice (a scanned loop) and one by a static slice (an unrolled
    # one), a norm slice (too small to be a copy), and the key and value windows sliced together (a
    # tuple); after the layers, the logits.
    assert count["cache copy"] == 2 * 28
    assert count["weight copy out of a stack"] == 2 * 28
    assert count["fusion"] == 3 * 28 + 1
    assert sum(count.values()) == 7 * 28 + 1


def test_tpu_loops_take_their_trip_count_from_the_condition():
    comps = bench.computations(TPU)
    line = next(text for text in comps["decode_body"] if " while(" in text)
    assert bench.condition_bound(comps, line) == 28
    count = bench.step_kernels(comps, "decode_body")
    # Per layer: a window sliced out of the cache, and the whole cache copied into another layout (the
    # TPU scatter's); a small copy is only a copy.
    assert count["cache copy"] == 2 * 28 and count["fusion"] == 2 * 28 and count["copy"] == 28
    assert count["custom-call"] == 28
    # The compiler's estimates, where it states them: none for the copies here or the custom call.
    cycles = bench.step_kernels(comps, "decode_body", cycles=True)
    assert cycles["cache copy"] == 300 * 28 and sum(cycles.values()) == 400 * 28


def test_result_shapes_read_tuples_and_layouts():
    line = "  %loop_dynamic_slice_fusion.7 = (bf16[1,2,8,6144,128]{4,3,2,1,0}, f32[32]{0}) fusion(%a), kind=kCustom"
    assert bench.result_shapes(line) == [(1, 2, 8, 6144, 128), (32,)]
    assert bench.result_shapes("  %g = bf16[28,1024]{1,0:T(8,128)(2,1)} fusion(%b)") == [(28, 1024)]
    assert bench._large(line, "slice", rank=5) and not bench._large(line, "slice", rank=4)
    assert not bench._large(line, "transpose")  # the kind is read from the instruction's name
