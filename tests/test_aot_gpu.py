"""Ahead-of-time compilation for NVIDIA presets: the cards as XLA's GPU compiler is told them, and what a
machine without JAX's CUDA plugin (CI) is told. The compiled figures are in docs/memory.md
(`python scripts/compile_presets.py --platform gpu`, with the plugin installed)."""
import importlib.util
import re
from pathlib import Path

import jax
import pytest

from spiral_jax import aot, hardware

HAS_CUDA_PLUGIN = any(importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") for v in (12, 13)) \
    if importlib.util.find_spec("jax_plugins") else False


@pytest.mark.parametrize("name", ["1xH200", "1xH100", "1xL40S", "1x4090", "8xH100"])
def test_every_nvidia_preset_names_a_card_with_its_memory(name):
    hw = hardware.hardware(name)
    assert hw.platform == "gpu" and hw.card is not None and hw.card.memory == hw.memory
    text = hw.card.target_config()
    fields = dict(re.findall(r"(\w+): ([\d.]+)\n", text))
    assert int(fields["device_memory_size"]) == hw.memory and int(fields["core_count"]) == hw.card.sms
    # A block may opt in to all of an SM's shared memory but the 1 KiB the driver keeps.
    assert int(fields["shared_memory_per_core"]) - int(fields["shared_memory_per_block_optin"]) == 1024
    major, minor = hw.card.compute_capability
    assert f"cuda_compute_capability {{ major: {major} minor: {minor} }}" in text
    # A driver as new as the runtime: XLA's graphs then hold what a real machine's would.
    assert 'driver_version: "12.8.0"' in text and "runtime_version { major: 12 minor: 8 }" in text


def test_a_device_kind_finds_its_card():
    assert hardware.gpu_card("NVIDIA H200").kind == "H200"
    assert hardware.gpu_card("NVIDIA H100 80GB HBM3").kind == "H100"
    assert hardware.gpu_card("NVIDIA GeForce RTX 4090").kind == "4090"
    assert hardware.gpu_card("TPU v5p") is None
    assert hardware.gpu_card("NVIDIA A100-SXM4-80GB").kind == "A100"
    # Boards with another data sheet than their family's entry: none, so their rates are measured.
    for kind in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA A100-PCIE-40GB", "NVIDIA GH200 480GB"):
        assert hardware.gpu_card(kind) is None, kind


def test_an_nvidia_preset_compiles_with_the_plugin_or_says_how_to_get_it():
    if HAS_CUDA_PLUGIN:
        tgt = aot.target("1xH200")
        assert [d.device_kind for d in tgt.devices] == ["NVIDIA H200"]
        assert tgt.memory == int(141e9 * 0.75)
        return
    with pytest.raises(aot.CompileError, match=r"1xH200.*pip install -e '\.\[cuda\]'"):
        aot.target("1xH200")


def test_plan_compile_without_the_plugin_says_how_to_get_it_in_one_line(monkeypatch, capsys):
    """`spiral-jax plan --compile` for an NVIDIA preset on a machine without JAX's CUDA plugin (as
    JAX describes no GPU topology then): the plan, then one line naming the install, and exit status 1."""
    from jax.experimental import topologies

    from spiral_jax import cli

    def no_plugin(*args, **kwargs):
        raise NotImplementedError("topology not implemented for cuda")

    monkeypatch.setattr(topologies, "get_topology_desc", no_plugin)
    config = Path(__file__).resolve().parents[1] / "configs" / "tiny_pig.py"
    code = cli.main(["spiral-jax", "plan", "--config", str(config), "--hardware", "1xH200", "--compile"])
    out, err = capsys.readouterr()
    assert code == 1 and "per device" in out, (out, err)
    lines = err.strip().splitlines()
    assert lines[-1].startswith("spiral-jax plan: cannot describe 1xH200's devices for XLA's GPU compiler"), err
    assert "pip install -e '.[cuda]'" in lines[-1] and "Traceback" not in err, err


def test_an_unknown_hardware_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown hardware 'h300'.*1xH200"):
        aot.target("h300")


def test_compiling_for_a_card_answers_cudnns_capability_questions_with_the_cards():
    """Without a GPU, JAX's cuDNN attention would take any card for a pre-Hopper one and refuse the
    packed layout of packed training rows; compiling for a preset it is told the preset's card."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    asked = cudnn.check_compute_capability
    assert not cudnn.check_compute_capability("9.0")  # no GPU here
    with aot.card_capability("1xH200"):
        assert cudnn.check_compute_capability("9.0") and not cudnn.check_compute_capability("10.0")
        assert cudnn.is_cuda_compute_capability_equal("9.0")
    with aot.card_capability("1x4090"):  # Ada, 8.9
        assert cudnn.check_compute_capability("8.9") and not cudnn.check_compute_capability("9.0")
    with aot.card_capability("v5p-8"):
        assert cudnn.check_compute_capability is asked
    assert cudnn.check_compute_capability is asked


def test_compiling_for_a_card_tells_pallas_triton_lowering_the_cards_capability():
    """From jax 0.11 Pallas' Triton lowering asks JAX for the GPU it lowers for, and with none refuses;
    compiling for a preset it is told the preset's card (jax 0.10 asks nothing: it takes 9.0)."""
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:  # jax 0.10: nothing to tell, and entering the context still patches cuDNN alone
        assert jax.__version_info__ < (0, 11), jax.__version__
        with aot.card_capability("1xH200"):
            pass
        return
    asked = gpu_info.get_gpu_info
    with aot.card_capability("1xH200"):
        assert gpu_info.get_gpu_info().compute_capability == 90
    with aot.card_capability("1x4090"):
        assert gpu_info.get_gpu_info().compute_capability == 89
    assert gpu_info.get_gpu_info is asked
