"""The compute dtype of ``pearl run``: chosen from the CPU's features, the same for the servers and
the trainer, overridable from the config and the command line, and said in the run's first lines."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pearl.config import CONFIG_DIR, ConfigError, load_config
from pearl.core.state import Role
from pearl.dtypes import CpuFeatures, choose_dtype, parse_cpu_flags, read_cpu_features, resolve_run_dtypes
from pearl.engines.base import ServerSpec
from pearl.engines.vllm import VllmEngine
from pearl.engines.vllm_server import VllmServer, VllmSettings
from pearl.run import _apply_cli

AVX2_EPYC = CpuFeatures("AVX2", frozenset({"sse4_2", "avx", "avx2", "fma"}))
AVX512_NO_BF16 = CpuFeatures("AVX512", frozenset({"avx2", "avx512f", "avx512bw", "avx512_vnni"}))
AVX512_BF16 = CpuFeatures("AVX512", frozenset({"avx2", "avx512f", "avx512_bf16"}))
SAPPHIRE_RAPIDS = CpuFeatures("AMX", frozenset({"avx512f", "amx_tile", "amx_bf16"}))


@pytest.mark.parametrize(("features", "want"), [
    (AVX2_EPYC, "float32"), (AVX512_NO_BF16, "float32"), (AVX512_BF16, "bfloat16"), (SAPPHIRE_RAPIDS, "bfloat16"),
    (CpuFeatures("", frozenset()), "float32"),
])
def test_auto_takes_bf16_only_where_the_cpu_multiplies_it_natively(features: CpuFeatures, want: str) -> None:
    c = choose_dtype("auto", features, "cpu")
    assert c.dtype == want
    assert c.requested == "auto"
    assert ("native bf16" in c.reason) and (("no native" in c.reason) == (want == "float32"))


def test_auto_on_a_gpu_and_explicit_overrides() -> None:
    assert choose_dtype("auto", AVX2_EPYC, "cuda").dtype == "bfloat16"
    assert choose_dtype("bfloat16", AVX2_EPYC, "cpu").dtype == "bfloat16"  # an override is obeyed, and said
    assert choose_dtype("bfloat16", AVX2_EPYC, "cpu").reason == "bfloat16 as configured"
    assert choose_dtype("float32", SAPPHIRE_RAPIDS, "cpu").dtype == "float32"
    with pytest.raises(ValueError, match="'fp8'"):
        choose_dtype("fp8", AVX2_EPYC)


def test_cpuinfo_flags_and_the_probe_of_this_machine(tmp_path: Path) -> None:
    text = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2 fma\nbugs\t\t: spectre\n"
    assert parse_cpu_flags(text) == frozenset({"fpu", "sse", "avx2", "fma"})
    assert parse_cpu_flags("no flags here") == frozenset()
    f = tmp_path / "cpuinfo"
    f.write_text(text)
    assert read_cpu_features(f).flags == frozenset({"fpu", "sse", "avx2", "fma"})
    assert read_cpu_features(tmp_path / "missing").flags == frozenset()
    here = read_cpu_features()
    assert here.capability  # torch names its kernel level (AVX2, AVX512, ...)


def test_the_run_resolves_servers_and_trainer_alike_and_says_why() -> None:
    cfg = load_config(CONFIG_DIR / "cpu-demo.yaml")
    assert (cfg.engine.dtype, cfg.train.compute_dtype) == ("auto", "auto")
    out, d = resolve_run_dtypes(cfg, AVX2_EPYC, "cpu")
    assert (out.engine.dtype, out.train.compute_dtype) == ("float32", "float32")
    lines = d.lines()
    assert lines[0].startswith("servers compute in float32 (auto: this CPU has no native bf16 (torch capability AVX2")
    assert lines[1].startswith("trainer computes in float32")
    out, d = resolve_run_dtypes(cfg, AVX512_BF16, "cpu")
    assert (out.engine.dtype, out.train.compute_dtype) == ("bfloat16", "bfloat16")
    assert "avx512_bf16" in d.lines()[0]


def test_command_line_dtype_overrides_both_sides() -> None:
    cfg = load_config(CONFIG_DIR / "cpu-demo.yaml")
    args = argparse.Namespace(tiny=False, env=None, batch=None, dtype="float32")
    out = _apply_cli(cfg, args)
    assert (out.engine.dtype, out.train.compute_dtype) == ("float32", "float32")
    _, d = resolve_run_dtypes(out, SAPPHIRE_RAPIDS, "cpu")
    assert d.engine.reason == d.train.reason == "float32 as configured"


def test_a_bad_dtype_in_the_config_is_refused_with_the_field() -> None:
    with pytest.raises(ConfigError, match=r"engine\.dtype"):
        load_config(CONFIG_DIR / "cpu-demo.yaml", {"engine.dtype": "fp16"})


def test_the_vllm_server_is_started_with_the_resolved_dtype(tmp_path: Path) -> None:
    spec = ServerSpec("r0", ("0",), Role.COLOCATED, "/models/m")
    for dtype in ("float32", "bfloat16"):
        srv = VllmServer(spec=spec, log_dir=tmp_path, settings=VllmSettings(dtype=dtype), kv_role=None)
        cmd = srv.command()
        assert cmd[cmd.index("--dtype") + 1] == dtype
    cfg = load_config(CONFIG_DIR / "cpu-demo.yaml", {"engine.dtype": "float32"})
    assert VllmEngine.from_config(cfg.engine, tmp_path).settings.dtype == "float32"
    auto = VllmEngine.from_config(load_config(CONFIG_DIR / "cpu-demo.yaml").engine, tmp_path).settings.dtype
    assert auto == choose_dtype("auto", read_cpu_features(), "cpu").dtype


def test_a_trainer_rank_given_auto_probes_its_own_cpu_and_obeys_an_explicit_dtype(tmp_path: Path) -> None:
    from pearl.config import TrainSpec
    from pearl.train.trainer import RankConfig, TrainerRank

    def rank(dtype: str) -> TrainerRank:
        return TrainerRank(RankConfig("unused", str(tmp_path), TrainSpec(compute_dtype=dtype)))  # type: ignore[arg-type]

    assert rank("auto").compute_dtype == choose_dtype("auto", read_cpu_features(), "cpu").dtype
    assert rank("float32").compute_dtype == "float32"
    assert rank("bfloat16").compute_dtype == "bfloat16"
    assert TrainSpec().compute_dtype == "float32"  # a bare spec stays exact on every machine
