"""The dashboard of a store holding three builds, rendered by headless Chromium.

The checks read what Chromium made of the page (its DOM after parsing, and a
screenshot), not the HTML we wrote: a name containing ``<script>`` must come
out as text a person reads, not as an element.
"""

from __future__ import annotations

import html.parser
import shutil
import subprocess

import pytest

from conformance.outcome import Outcome, Status
from report.coverage import headline
from results.groups import error_signature
from results.store import ResultStore
from tests.conftest import run_cli
from tests.results.rows import model, op, write_build

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HOSTILE = "<script>document.body.setAttribute('data-pwned','1')</script>"
HOSTILE_MESSAGE = "boom <img src=x onerror=\"document.title='pwned'\"> & <b>bold</b>"


def chromium(*args: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", *args],
        capture_output=True, text=True, timeout=120)


class Dom(html.parser.HTMLParser):
    """Elements and visible text, per section, of the DOM Chromium dumped."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict]] = []
        self.text: dict[str, list[str]] = {}
        self._section = "top"
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs))
        if tag == "section":
            self._section = attrs.get("id", "?")
        if tag in ("style", "title"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("style", "title"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip and data.strip():
            self.text.setdefault(self._section, []).append(" ".join(data.split()))

    def section(self, name: str) -> str:
        return " ".join(self.text.get(name, []))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard")
    results = tmp / "runs"
    add_f, add_b, tanh_f, gelu = op("add"), op("add", mode="backward"), op("tanh"), op("nn.functional.gelu", "bfloat16")
    evil = op(HOSTILE)
    r_eval, r_train, r_steps = (model("timm", "resnet18", m) for m in ("eval", "train", "steps5"))
    v_eval, v_train = model("timm", "vit_tiny", "eval"), model("timm", "vit_tiny", "train")
    g_eval = model("hf", "gpt2", "eval")
    curves = results / "artifacts" / "curves"
    curves.mkdir(parents=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(4, 3))
    plt.plot([2.3, 1.9, 1.4, 1.1], label="cpu")
    plt.plot([2.3, 1.9, 1.5, 1.3], label="neuron")
    plt.legend()
    fig.savefig(curves / "resnet18_loss.png")
    (curves / "evil.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40">'
                                     "<script>alert(1)</script><rect width='40' height='40' fill='red'/></svg>")
    repro = results / "artifacts" / "repro" / tanh_f.id / "repro.py"
    repro.parent.mkdir(parents=True)
    repro.write_text("print('reproducing tanh')\n")
    with ResultStore.open(results) as store:
        everything = [add_f, add_b, tanh_f, gelu, r_eval, r_train, r_steps, v_eval, v_train, g_eval]
        write_build(store, "b1", [(c, "pass") for c in everything], created=1000.0)
        write_build(store, "b2", [(c, "pass") for c in everything] + [(evil, "pass")], created=2000.0)
        write_build(store, "b3", [(add_f, "pass"), (add_b, "pass"), (tanh_f, "mismatch"), (gelu, "error"),
                                  (evil, "error"), (r_eval, "pass"), (r_train, "pass"), (r_steps, "crash"),
                                  (v_eval, "pass"), (v_train, "mismatch"), (g_eval, "pass")],
                    created=3000.0, messages={evil.id: HOSTILE_MESSAGE}, repros={tanh_f.id: str(repro)})
        # Curves a result names: this build's is shown with its case; another build's is not shown.
        for build, name in (("b2", "old"), ("b3", "new")):
            png = curves / build / f"resnet18_train_{name}.png"
            png.parent.mkdir()
            fig.savefig(png)
            store.record(build, r_train, Outcome(case_id=r_train.id, status=Status.PASS,
                                                 evidence={"artifacts": {"loss_curve": str(png)}}))
        expected = headline(store.statuses("b3"))
    out = tmp / "site"
    r = run_cli("neuron-conformance", "dashboard", "--results", str(results), "--build", "b3", "--baseline", "b2",
                "--out", str(out))
    assert r.returncode == 0, r.stderr
    return {"out": out, "tmp": tmp, "expected": expected, "tanh": tanh_f, "evil": evil}


def test_headline_figures():
    """Hand-counted: pairs add/f32 (fwd+bwd pass), tanh/f32 (fails), gelu/bf16 (fails), evil/f32 (fails)."""
    rows = [type("R", (), dict(kind="op", name=n, category="", dtype=d, mode=m, status=s, case_id=n + m))()
            for n, d, m, s in [("add", "f32", "forward", "pass"), ("add", "f32", "backward", "pass"),
                               ("tanh", "f32", "forward", "mismatch"), ("tanh", "f32", "backward", "pass")]]
    for r in rows:
        r.status = Status(r.status)
    h = headline(rows)
    assert (h.ops.passed, h.ops.total, h.op_cases.passed, h.op_cases.total) == (1, 2, 3, 4)


def test_error_signatures_group_particulars():
    a = "sample 3: output: Mismatched elements: 37 / 4096 (0.9%); greatest absolute difference 3.1e-3 at index (2, 17)"
    b = "sample 0: output: Mismatched elements: 2 / 9 (22.2%); greatest absolute difference 0.5 at index (0,)"
    assert error_signature(a) == error_signature(b) == "output: Mismatched elements: N / N (N%)"
    assert error_signature("RuntimeError: could not run 'aten::sort' at 0x7f00beef in /opt/x/lib.so") == \
        "RuntimeError: could not run 'aten::sort' at 0x… in …"


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
def test_dashboard_renders_in_headless_chromium(site):
    index = site["out"] / "index.html"
    r = chromium("--dump-dom", index.as_uri(), tmp_path=site["tmp"])
    assert r.returncode == 0 and "<html" in r.stdout, r.stderr[-2000:]
    dom = Dom()
    dom.feed(r.stdout)
    tags = [t for t, _ in dom.elements]

    # A name and a message with markup in them are text, not elements.
    assert "script" not in tags
    assert not any("onerror" in attrs for _, attrs in dom.elements)
    body = next(attrs for t, attrs in dom.elements if t == "body")
    assert "data-pwned" not in body
    assert HOSTILE in dom.section("failures") and HOSTILE_MESSAGE in dom.section("failures")
    assert "<b>bold</b>" in dom.section("errors") or "<b>bold</b>" in dom.section("failures")

    # The headline, with the figures coverage.py computes (checked by hand in test_headline_figures).
    expected = site["expected"]
    text = dom.section("headline")
    assert f"{expected.ops.percent:.1f}% of op × dtype pairs pass ({expected.ops.passed} of {expected.ops.total};" in text
    assert "25.0% of op × dtype pairs pass (1 of 4;" in text
    assert "timm , 2 architectures: 100.0% pass forward (2 of 2); 50.0% pass backward (1 of 2); " \
           "0.0% pass training (0 of 2)." in text
    assert "hf , 1 architecture: 100.0% pass forward (1 of 1); backward not run; training not run." in text

    # Regressions and fixes against the baseline, each with its reproducer.
    changes = dom.section("changes")
    assert "Regressions: passed in the baseline, fail now (5)" in changes
    for title in ("op:tanh[float32,forward]", "model:resnet18.timm[float32,steps5]", HOSTILE):
        assert title in changes
    link = next(a["href"] for t, a in dom.elements if t == "a" and a.get("href", "").startswith("repro/"))
    assert (site["out"] / link).read_text() == "print('reproducing tanh')\n"

    # The trend covers the three builds; the matrix and the family table are there.
    trend = dom.section("trend")
    assert all(f"{b} " in trend or f"{b}(" in trend for b in ("b1", "b2", "b3 (this build)"))
    assert "100.0%" in trend and f"{expected.ops.percent:.1f}%" in trend
    cells = {a.get("title"): a.get("class") for t, a in dom.elements if t == "td" and "cell" in a.get("class", "")}
    assert cells["tanh float32: forward: mismatch"] == "cell fail"
    assert cells["add float32: backward: pass, forward: pass"] == "cell pass"
    assert "vit_tiny" in dom.section("models") and "resnet18" in dom.section("models")
    groups = dom.section("groups")  # the page leads with failures grouped by op and cause
    assert "tanh : wrong results" in groups and "Mismatched elements: N / N (N%)" in groups
    # The zoo survey's architectures that cannot be built, each with its reason, from the shipped status file.
    from model_zoo.status import load_status

    unbuilt = next((n, r) for n, r in sorted(load_status().items()) if r["status"] != "ok")
    assert "Zoo survey" in dom.section("models") and unbuilt[0] in dom.section("models")

    # Loss curves: every image the site shows is a file inside the site.
    images = [a["src"] for t, a in dom.elements if t == "img"]
    assert len(images) == 3 and all((site["out"] / src).is_file() for src in images)
    curves = dom.section("curves")
    assert "model:resnet18.timm[float32,train]: loss_curve" in curves and "resnet18_loss.png" in curves
    assert "old" not in curves, "a curve another build's result names is that build's"


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
def test_dashboard_screenshot_shows_the_styled_page(site):
    """What Chromium painted, not the size we asked for: the header band across the top, and the matrix's
    pass and fail cells in their colours (the DOM test found one of each), so the stylesheet applied and the
    matrix was laid out. The window is tall enough for the whole page."""
    from PIL import Image

    shot = site["tmp"] / "shot.png"
    r = chromium("--window-size=1280,8000", "--hide-scrollbars", f"--screenshot={shot}",
                 (site["out"] / "index.html").as_uri(), tmp_path=site["tmp"])
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    with Image.open(shot) as im:
        rgb = im.convert("RGB")
        header = {rgb.getpixel((x, 4)) for x in range(0, rgb.width, 40)}
        counts = {colour: n for n, colour in rgb.getcolors(maxcolors=1 << 22)}
    assert header == {(0x23, 0x2F, 0x3E)}, f"the header band is not painted across the top: {header}"
    cell = 10  # a matrix cell is at least 22 px wide: many pixels of its colour
    assert counts.get((0x58, 0xB3, 0x68), 0) > cell * cell, "no pass cell painted"
    assert counts.get((0xD9, 0x53, 0x4F), 0) > cell * cell, "no fail cell painted"
    assert counts.get((0xF6, 0xF7, 0xF9), 0) > counts.get((0xFF, 0xFF, 0xFF), 0) / 100, "no page background"
