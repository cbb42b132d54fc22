"""The quality table's arithmetic: gaps to each model's own fp32, AWQ's over RTN's at the same bits."""

from compress.bench import quant_quality as qq


def row(model, name, ppl, seconds=1.0):
    return {"model": model, "name": name, "seconds": None if name == "fp32" else seconds, "mib": 100.0, "ppl": ppl}


def test_table_gives_each_models_gaps_against_its_own_fp32():
    rows = [row("a", "fp32", 20.0), row("a", "rtn int4", 30.0), row("a", "awq int4", 23.0),
            row("b", "fp32", 27.0), row("b", "rtn int4", 31.0), row("b", "awq int4", 28.0)]
    lines = qq.table(rows).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [c[5] for c in cells] == ["+0.000", "+10.000", "+3.000", "+0.000", "+4.000", "+1.000"]
    assert cells[2][6] == "**0.30**" and cells[5][6] == "**0.25**"  # 3/10 and 1/4
    assert cells[0][2] == "-" and cells[1][6] == ""
