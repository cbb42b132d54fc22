"""The quality table's arithmetic (gaps to each model's own fp32, each method's over RTN's at the same bits), the
AutoRound setting, the tuned AWQ rows, the reuse of earlier checkpoints and the options' checks."""

import click
import pytest

from compress.bench import quant_quality as qq


def row(model, name, ppl, seconds=1.0):
    bits = None if name == "fp32" else int(name.split("int")[1][0])
    return {"model": model, "name": name, "bits": bits, "seconds": None if name == "fp32" else seconds, "mib": 100.0,
            "ppl": ppl}


def test_table_gives_each_models_gaps_against_its_own_fp32():
    rows = [row("a", "fp32", 20.0), row("a", "rtn int4", 30.0), row("a", "awq int4", 23.0),
            row("b", "fp32", 27.0), row("b", "rtn int4", 31.0), row("b", "awq int4", 28.0)]
    lines = qq.table(rows).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [c[5] for c in cells] == ["+0.000", "+10.000", "+3.000", "+0.000", "+4.000", "+1.000"]
    assert cells[2][6] == "**0.30**" and cells[5][6] == "**0.25**"  # 3/10 and 1/4
    assert cells[0][2] == "-" and cells[1][6] == ""


def test_other_methods_are_measured_against_rtn_at_the_same_bits():
    rows = [row("a", "fp32", 20.0), row("a", "rtn int4", 30.0), row("a", "autoround int4 (200 iters, 128x512)", 25.0),
            row("a", "rtn int3", 60.0), row("a", "awq int3", 30.0)]
    rows[2]["mib"] = None  # AutoRound's dequantized checkpoint: not the format's size
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in qq.table(rows).splitlines()[2:]]
    assert [c[6] for c in cells] == ["", "", "**0.50**", "", "**0.25**"]  # 5/10 and 10/40
    assert cells[2][3] == "-" and cells[1][3] == "100.0"


def test_autoround_setting_parses_iters_samples_seqlen():
    run = qq.AutoRoundRun.parse("200x128x512")
    assert (run.iters, run.nsamples, run.seqlen) == (200, 128, 512)
    assert run.label(4) == "autoround int4 (200 iters, 128x512)" and run.dirname(3) == "autoround-int3-i200-n128-s512"
    for bad in ("200x128", "ax128x512", "200x0x512", "-1x128x512"):
        with pytest.raises(click.BadParameter, match="ITERSxSAMPLESxSEQLEN"):
            qq.AutoRoundRun.parse(bad)


def test_made_remembers_the_seconds_and_reuses_them_only_when_asked(tmp_path):
    calls = []

    def make():
        calls.append(1)
        return tmp_path / "ckpt", 12.5

    dest = tmp_path / "rtn-int4"
    assert qq.made(dest, make, reuse=True) == (tmp_path / "ckpt", 12.5)  # nothing recorded yet: made
    assert qq.made(dest, make, reuse=True) == (tmp_path / "ckpt", 12.5) and len(calls) == 1
    qq.made(dest, make, reuse=False)
    assert len(calls) == 2


def test_each_tuning_count_is_one_awq_row_that_passes_it_to_quantize(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(qq, "run_quantize", lambda model, cfg, dest, force: seen.append((model, cfg.method, cfg.tune_iters, dest)))
    jobs = qq.bits_jobs("m", tmp_path, 4, ["rtn"], [50, 200], None)
    assert [(name, dest.name, sized) for name, dest, _, sized in jobs] == [
        ("rtn int4", "rtn-int4", True), ("awq int4 + 50 tuning steps", "awq-tune50-int4", True),
        ("awq int4 + 200 tuning steps", "awq-tune200-int4", True)]
    for _, dest, make, _ in jobs:
        make(dest)
    assert [s[:3] for s in seen] == [("m", "rtn", 0), ("m", "awq", 50), ("m", "awq", 200)]


@pytest.mark.parametrize("args, hint", [(["--autoround", "200x128"], "--autoround"), (["--methods", "rtn,gptq"], "--methods"),
                                        (["--tune", "0"], "--tune")])
def test_bad_options_fail_before_any_work(args, hint, tmp_path):
    from click.testing import CliRunner

    result = CliRunner().invoke(qq.main, ["--out", str(tmp_path), *args])
    assert result.exit_code == 2 and hint in result.output and not any(tmp_path.iterdir())
