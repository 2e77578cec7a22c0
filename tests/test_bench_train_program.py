"""bench/train_program.py's reading of a compiled train step, on a hand-written program shaped as XLA:GPU
prints one: each product's FLOPs counted as often as its loops run it, split by part, pass and operand
dtypes, the unembedding found by its vocabulary axis whole or split over devices; and the bytes the
other kernels move."""
from tests.scripts import load_script

bench = load_script("bench/train_program.py")

VOCAB = 1000


def _gemm(name: str, lhs: str, rhs: str, out: str, contract: tuple[str, str], jax_name: str) -> str:
    return f"""
%{name}_computation (parameter_0: {lhs}, parameter_1: {rhs}) -> {out} {{
  %parameter_0.{name} = {lhs} parameter(0)
  %parameter_1.{name} = {rhs} parameter(1)
  ROOT %dot.{name} = {out} dot(%parameter_0.{name}, %parameter_1.{name}), lhs_contracting_dims={{{contract[0]}}}, rhs_contracting_dims={{{contract[1]}}}, metadata={{op_name="{jax_name}"}}
}}
"""


def _program(vocab_share: int) -> str:
    """A micro-batch loop of 4 trips around a layer loop of 3 (forward, remat's forward again, the
    backward; a layer's weights sliced out of a stack, its gradient written into one in place, and
    an elementwise product) and the unembedding of the micro-batch's 8 slots (forward; backward in
    fp32)."""
    table = f"bf16[{vocab_share},16]{{1,0}}"
    return (
        _gemm("fwd", "bf16[8,16]{1,0}", "bf16[32,16]{1,0}", "bf16[8,32]{1,0}", ("1", "1"),
              "jit(step)/while/body/jvp()/while/body/dot_general")
        + _gemm("again", "bf16[8,16]{1,0}", "bf16[32,16]{1,0}", "bf16[8,32]{1,0}", ("1", "1"),
                "jit(step)/while/body/transpose(jvp())/while/body/checkpoint/rematted_computation/dot_general")
        + _gemm("bwd", "bf16[8,32]{1,0}", "bf16[32,16]{1,0}", "bf16[8,16]{1,0}", ("1", "0"),
                "jit(step)/while/body/transpose(jvp())/while/body/dot_general")
        + _gemm("logits", "bf16[8,16]{1,0}", table, f"f32[8,{vocab_share}]{{1,0}}", ("1", "1"),
                "jit(step)/while/body/jvp()/closed_call/dot_general")
        + _gemm("dtable", f"f32[8,{vocab_share}]{{1,0}}", "f32[8,16]{1,0}", f"f32[{vocab_share},16]{{1,0}}",
                ("0", "0"), "jit(step)/while/body/transpose(jvp())/closed_call/dot_general")
        + f"""
%layer_cond (p: (s32[])) -> pred[] {{
  ROOT %lt = pred[] compare(%a, %b), direction=LT
}}

%fused_convert (param_0: f32[3,32,16], param_1: s32[]) -> bf16[1,32,16] {{
  %param_0 = f32[3,32,16]{{2,1,0}} parameter(0)
  %param_1 = s32[] parameter(1)
  %dynamic_slice = f32[1,32,16]{{2,1,0}} dynamic-slice(%param_0, %param_1, %param_1, %param_1), dynamic_slice_sizes={{1,32,16}}
  ROOT %convert = bf16[1,32,16]{{2,1,0}} convert(%dynamic_slice)
}}

%fused_dus (param_0: f32[3,32,16], param_1: bf16[1,32,16], param_2: s32[]) -> f32[3,32,16] {{
  %param_0 = f32[3,32,16]{{2,1,0}} parameter(0)
  %param_1 = bf16[1,32,16]{{2,1,0}} parameter(1)
  %param_2 = s32[] parameter(2)
  %convert.2 = f32[1,32,16]{{2,1,0}} convert(%param_1)
  ROOT %dynamic-update-slice = f32[3,32,16]{{2,1,0}} dynamic-update-slice(%param_0, %convert.2, %param_2, %param_2, %param_2)
}}

%fused_mul (param_0: bf16[8,32], param_1: bf16[8,32]) -> bf16[8,32] {{
  %param_0 = bf16[8,32]{{1,0}} parameter(0)
  %param_1 = bf16[8,32]{{1,0}} parameter(1)
  ROOT %multiply = bf16[8,32]{{1,0}} multiply(%param_0, %param_1)
}}

%layer_body (p: (s32[])) -> (s32[]) {{
  %stack = f32[3,32,16]{{2,1,0}} get-tuple-element(%p), index=1
  %grads = f32[3,32,16]{{2,1,0}} get-tuple-element(%p), index=2
  %i = s32[] get-tuple-element(%p), index=0
  %a = bf16[8,32]{{1,0}} get-tuple-element(%p), index=3
  %loop_convert_fusion = bf16[1,32,16]{{2,1,0}} fusion(%stack, %i), kind=kLoop, calls=%fused_convert
  %loop_dynamic_update_slice_fusion = f32[3,32,16]{{2,1,0}} fusion(%grads, %loop_convert_fusion, %i), kind=kLoop, calls=%fused_dus
  %loop_multiply_fusion = bf16[8,32]{{1,0}} fusion(%a, %a), kind=kLoop, calls=%fused_mul
  %gemm_fusion_dot.1 = bf16[8,32]{{1,0}} fusion(%x, %w), kind=kCustom, calls=%fwd_computation
  %gemm_fusion_dot.2 = bf16[8,32]{{1,0}} fusion(%x, %w), kind=kCustom, calls=%again_computation
  %gemm_fusion_dot.3 = bf16[8,16]{{1,0}} fusion(%g, %w), kind=kCustom, calls=%bwd_computation
}}

%micro_cond (p: (s32[])) -> pred[] {{
  ROOT %lt.2 = pred[] compare(%a, %b), direction=LT
}}

%micro_body (p: (s32[])) -> (s32[]) {{
  %while.1 = (s32[]) while(%t), condition=%layer_cond, body=%layer_body, backend_config={{"known_trip_count":{{"n":"3"}}}}
  %gemm_fusion_dot.4 = f32[8,{vocab_share}]{{1,0}} fusion(%h, %e), kind=kCustom, calls=%logits_computation
  %gemm_fusion_dot.5 = f32[{vocab_share},16]{{1,0}} fusion(%dl, %hf), kind=kCustom, calls=%dtable_computation
}}

ENTRY %main (p: s32[]) -> s32[] {{
  %while.2 = (s32[]) while(%t), condition=%micro_cond, body=%micro_body, backend_config={{"known_trip_count":{{"n":"4"}}}}
}}
""")


def test_products_are_counted_as_often_as_their_loops_run_them_by_part_pass_and_dtype():
    flops = bench.product_flops(_program(VOCAB), VOCAB)
    layer = 2 * 8 * 32 * 16 * 3 * 4  # one [8, 16] x [16, 32] product, 3 layers, 4 micro-batches
    unembedding = 2 * 8 * VOCAB * 16 * 4
    assert flops == {("layers", "forward", "bf16 x bf16"): layer,
                     ("layers", "recomputed", "bf16 x bf16"): layer,
                     ("layers", "backward", "bf16 x bf16"): layer,
                     ("unembedding", "forward", "bf16 x bf16"): unembedding,
                     ("unembedding", "backward", "f32 x f32"): unembedding}


def test_the_unembedding_is_found_by_each_devices_share_of_the_vocabulary():
    shared = bench.product_flops(_program(VOCAB // 4), VOCAB, devices=4)
    assert shared[("unembedding", "forward", "bf16 x bf16")] == 2 * 8 * (VOCAB // 4) * 16 * 4
    assert not any(part == "unembedding" for part, _, _ in bench.product_flops(_program(VOCAB // 4), VOCAB))


def test_other_kernels_move_their_operands_and_results_slices_and_in_place_updates_at_the_slices_size():
    kernels, moved = bench.other_traffic(_program(VOCAB))
    layer_slice = 32 * 16 * 4  # f32 read out of the stack (the whole stack is 3 layers of it)
    sliced = layer_slice + layer_slice // 2 + 4  # the slice read, its bf16 copy written, the index
    updated = layer_slice + layer_slice // 2 + 4  # the f32 update written in place, the bf16 one read
    product = 3 * 8 * 32 * 2  # two bf16 operands and the result
    assert kernels == 3 * 3 * 4  # 3 kernels a layer; the gemm fusions are the products'
    assert moved == (sliced + updated + product) * 3 * 4
