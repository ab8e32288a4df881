"""report.html: one self-contained page holding the figure, both tables, Table 1 and the
failures, checked by parsing it and, where Debian's Chromium is installed, by rendering it
in headless Chromium with the network off."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.colors
import matplotlib.image
import numpy as np
import pytest

from analysis.report import load_runs, method_style, write_report
from tests.analysis.test_report import PRIVATE, make_run, row, write_model_predictions
from tests.proxyfl.conftest import write_stores
from wsi.preprocess import record_failed_center
from wsi.summary import CenterReport, SlideFailure, report_path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Page(HTMLParser):
    """Tags, the attributes that fetch or link, and every table's cells by table id."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.sources: list[str] = []
        self.links: list[str] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.text: list[str] = []
        self.title = ""
        self._in_title = False
        self._table: str | None = None
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        values = dict(attrs)
        if "src" in values:
            self.sources.append(values["src"] or "")
        if "href" in values:
            self.links.append(values["href"] or "")
        self._in_title = tag == "title"
        if tag == "table":
            self._table = values.get("id") or ""
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
            self._in_title = False
            return
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def markdown_cells(path: Path) -> list[list[str]]:
    """The header and body cells of the markdown table in ``path`` (alignment row dropped)."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")]
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]
    return [rows[0], *rows[2:]]


@pytest.fixture
def report(tmp_path: Path) -> tuple[Path, Path]:
    """ProxyFL and PrivateKT runs on centres 0 and 1 (centre 4 the public pool), and the
    stores' reports: centres 0, 1 and 4 complete (one slide of centre 1 left out), centre
    2 failed, and a damaged centre 3 report."""
    runs_dir = tmp_path / "runs"
    make_run(
        runs_dir,
        "ProxyFL",
        0,
        [
            row("ProxyFL", 0, c, r, 0.6 + 0.1 * r + 0.05 * c, epsilon=r)
            for c in (0, 1)
            for r in (1, 2, 3)
        ],
    )
    ldp = [{**row("PrivateKT", 0, c, r, 0.5 + 0.1 * r, epsilon=5.0 * r), "delta": 0.0,
            "evaluated_model": "central", "privacy_notion": "label_ldp",
            "epsilon_per_round": 5.0} for c in (0, 1) for r in (1, 2, 3)]  # fmt: skip
    private_kt = make_run(runs_dir, "PrivateKT", 0, ldp)
    run = json.loads((private_kt / "run.json").read_text())
    run["config"]["public_center"] = 4
    (private_kt / "run.json").write_text(json.dumps(run))

    stores = tmp_path / "patches"
    stores.mkdir()
    left_out = SlideFailure("patient_021_node_3", "tissue", "no tissue <at level 2> & none", 1)
    for center, failures in ((0, []), (1, [left_out]), (4, [])):
        report = CenterReport(
            center=center,
            counts={"train": {"healthy": 8 + center, "tumor": 8},
                    "test": {"healthy": 2, "tumor": 2}},
            patients={"train": [f"patient_{center}00", f"patient_{center}01"],
                      "test": [f"patient_{center}02"]},
            store=f"center_{center}.h5", failures=failures,
        )  # fmt: skip
        report_path(stores, center).write_text(json.dumps(report.to_json()))
    record_failed_center(2, "centre 2 can supply only 3 healthy, 0 tumor patches", stores)
    report_path(stores, 3).write_text('{"center": 3, "counts"')  # a half-written file
    return runs_dir, stores


def test_the_page_holds_figure_tables_table_1_and_failures_and_fetches_nothing(
    report: tuple[Path, Path], tmp_path: Path
) -> None:
    runs_dir, stores = report
    paths = write_report(load_runs(runs_dir), tmp_path / "results", stores)
    page = Page(paths.report_html.read_text())

    # self-contained: nothing to fetch, nothing to run, links stay in the report's folder
    assert not {"script", "link", "iframe", "object", "embed"} & set(page.tags)
    assert len(page.sources) == 1 and page.sources[0].startswith("data:image/png;base64,")
    figure = base64.b64decode(page.sources[0].removeprefix("data:image/png;base64,"))
    assert figure == paths.curves_png.read_bytes()
    for link in page.links:
        assert link.startswith("#") or (paths.report_html.parent / link).is_file(), link
    assert {"accuracy.csv", "metrics.json", "curves.png"} <= {Path(x).name for x in page.links}

    # the same cells as the markdown tables
    assert page.tables["accuracy-table"] == markdown_cells(paths.accuracy_md)
    assert page.tables["privacy-table"] == markdown_cells(paths.privacy_md)
    # the model each row evaluates, then the majority class: no predictions here, so from
    # the clients' centre reports' test counts (2 healthy, 2 tumour each: a tie, healthy)
    assert [r[:2] for r in page.tables["accuracy-table"][1:]] == [
        ["ProxyFL", "private"], ["PrivateKT", "central"], ["majority class (always healthy)", "—"],
    ]  # fmt: skip
    assert page.tables["accuracy-table"][3][2:] == ["0.500", "0.500", "—"]
    text = " ".join("".join(page.text).split())
    assert "label-level ε-local DP" in text and "not comparable as numbers" in text
    assert "from the centre reports' test counts" in text

    # what the numbers are of: these centre reports predate data_root and synthetic
    assert "Data: unknown (the centre report(s) of centre(s) 0, 1, 4" in text
    assert "Camelyon-17" not in page.title and "data unknown" in page.title
    # no predictions recorded: the clinical sections say so, the page still renders
    assert "clinical-table" not in page.tables and "per-centre-table" not in page.tables
    assert "No predictions recorded: no sensitivity, specificity or AUC." in text
    assert "No predictions recorded for: ProxyFL, PrivateKT" in text
    configuration = dict((r[0], r[1:]) for r in page.tables["configuration-table"][1:])
    assert configuration["sigma"] == ["1.4", "ProxyFL"]  # not PrivateKT: no DP-SGD
    assert configuration["public_share / public_center"] == ["centre 4's store", "PrivateKT"]
    assert configuration["patches"][0].startswith("not read: centre 0: ")
    assert (
        "accuracy / macro-accuracy: ProxyFL 0.925 / 0.925, PrivateKT 0.800 / 0.800; "
        "max ε 3.000 (sample-level DP), 15.000 (label-level LDP)"
    ) in text  # the result

    # Table 1: complete centres by split, with the role each played in the runs
    table_1 = page.tables["table-1"]
    assert table_1[0] == ["centre", "split", "healthy", "tumour", "total", "patients", "role"]
    assert [r[:5] for r in table_1[1:]] == [
        ["0", "train", "8", "8", "16"], ["0", "test", "2", "2", "4"],
        ["1", "train", "9", "8", "17"], ["1", "test", "2", "2", "4"],
        ["4", "train", "12", "8", "20"], ["4", "test", "2", "2", "4"],
    ]  # fmt: skip
    assert [r[6] for r in table_1[1::2]] == [
        "client", "client", "public pool (PrivateKT; labels unused)"
    ]  # fmt: skip
    assert table_1[2][5] == "patient_002"

    # failures: the slide left out and the failed centre, escaped; the damaged report named
    failures = page.tables["failures-table"]
    assert failures[1] == ["patient_021_node_3", "1", "tissue", "no tissue <at level 2> & none"]
    assert failures[2][:3] == ["center_2", "2", "centre"] and "only 3 healthy" in failures[2][3]
    assert "Preprocessing failures (2)" in text
    assert f"Could not read {report_path(stores, 3)}: not a centre report" in text


def test_without_stores_the_page_says_table_1_is_not_shown(
    report: tuple[Path, Path], tmp_path: Path
) -> None:
    runs_dir, _ = report
    paths = write_report(load_runs(runs_dir), tmp_path / "results")
    page = Page(paths.report_html.read_text())
    assert "table-1" not in page.tables and "failures-table" not in page.tables
    assert "No store directory given" in " ".join(page.text)


def test_the_report_says_which_public_pool_privatekt_used(
    report: tuple[Path, Path], tmp_path: Path
) -> None:
    runs_dir, stores = report
    paths = write_report(load_runs(runs_dir), tmp_path / "before", stores)
    said = "PrivateKT's public pool: centre 4's whole store, labels unused"
    assert said in paths.privacy_md.read_text()  # a run made before the option: centre 4
    assert said in " ".join(Page(paths.report_html.read_text()).text)
    run_file = runs_dir / "PrivateKT" / "seed_0" / "run.json"
    run = json.loads(run_file.read_text())
    run["config"].update(public_pool="share", public_share=0.2)
    run_file.write_text(json.dumps(run))
    paths = write_report(load_runs(runs_dir), tmp_path / "share", stores)
    text = paths.privacy_md.read_text()
    assert "PrivateKT's public pool: 20% of each client's training split" in text
    assert "centre 4" not in text
    # centre 4 is no longer the pool: Table 1 does not call it one
    assert "public pool (PrivateKT; labels unused)" not in paths.report_html.read_text()


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                    "(apt-get install chromium): the page is checked by parsing only")  # fmt: skip
def test_headless_chromium_renders_the_page_offline(
    report: tuple[Path, Path], tmp_path: Path
) -> None:
    """Chromium, with every host unresolvable, lays the page out and paints Figure 8:
    the screenshot holds ProxyFL's colour where the figure is."""
    runs_dir, stores = report
    paths = write_report(load_runs(runs_dir), tmp_path / "results", stores)
    screenshot = tmp_path / "report.png"
    command = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp_path / 'profile'}",
        "--hide-scrollbars", "--window-size=1280,2600", f"--screenshot={screenshot}",
        paths.report_html.as_uri(),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    dom = subprocess.run(
        [*command[:-2], "--dump-dom", paths.report_html.as_uri()],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    assert 'id="table-1"' in dom and "public pool (PrivateKT; labels unused)" in dom

    pixels = matplotlib.image.imread(screenshot)[..., :3]
    proxyfl = np.array(matplotlib.colors.to_rgb(method_style("ProxyFL").color))
    near = np.abs(pixels - proxyfl).max(axis=-1) < 0.04
    rows = np.flatnonzero(near.any(axis=1))
    assert near.sum() > 200, "Figure 8's ProxyFL line is not on the screenshot"
    assert rows.min() < 900  # the figure comes first, above the tables


def _record_data(stores: Path, sources: dict[int, tuple[str, bool]]) -> None:
    """Add ``data_root`` and ``synthetic`` to the centre reports, as preprocessing now
    writes them."""
    for center, (root, synthetic) in sources.items():
        path = report_path(stores, center)
        data = json.loads(path.read_text())
        data.update(data_root=root, synthetic=synthetic)
        path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("sources", "line", "title"),
    [
        ({c: ("data/synthetic", True) for c in (0, 1, 4)},
         "Synthetic slides (written by wsi.synth, data/synthetic): these numbers show the "
         "pipeline works, not how the methods do on Camelyon-17.",
         "Federated learning on synthetic slides (a pipeline check, not Camelyon-17): report"),
        ({c: ("/data/camelyon17", False) for c in (0, 1, 4)},
         "Real slides from /data/camelyon17.",
         "Federated learning on real slides (/data/camelyon17): report"),
        ({0: ("data/synthetic", True), 1: ("/data/camelyon17", False),
          4: ("/data/camelyon17", False)},
         "Mixed data: synthetic slides (written by wsi.synth, data/synthetic) and real slides "
         "from /data/camelyon17 (centre 0: synthetic; centre 1: real; centre 4: real)",
         "Federated learning on mixed synthetic and real slides: report"),
        ({0: ("data/synthetic", True), 1: ("data/synthetic", True)},  # centre 4's says nothing
         "Data: unknown (the centre report(s) of centre(s) 4 in",
         "Federated learning on histopathology patches (data unknown): report"),
    ],
)  # fmt: skip
def test_the_page_says_what_slides_the_numbers_are_of(
    report: tuple[Path, Path], tmp_path: Path, sources: dict, line: str, title: str
) -> None:
    runs_dir, stores = report
    _record_data(stores, sources)
    paths = write_report(load_runs(runs_dir), tmp_path / "results", stores)
    page = Page(paths.report_html.read_text())
    text = " ".join("".join(page.text).split())
    assert page.title == title
    assert line in text
    assert text.index(line) < text.index("accuracy / macro-accuracy:")  # above the results
    for table in (paths.accuracy_md, paths.clinical_md, paths.per_centre_md,
                  paths.configuration_md):  # fmt: skip
        assert line in " ".join(table.read_text().split()), table.name


def test_the_page_with_predictions_and_stores(tmp_path: Path) -> None:
    """Runs with predictions, stores with their attributes and centre reports recording
    synthetic slides: every new table is on the page with the markdown's cells, the
    configuration states the patch geometry, the method of the intervals is stated."""
    runs_dir = tmp_path / "runs"
    rows = [row("ProxyFL", 0, c, 1, 0.6) for c in (0, 1)]
    run_dir = make_run(runs_dir, "ProxyFL", 0, rows)
    for client in (0, 1):
        write_model_predictions(run_dir, client, {"private": PRIVATE[client]})
    make_run(runs_dir, "Regular", 0, [row("Regular", 0, c, 1, 0.55) for c in (0, 1)])
    stores = write_stores(tmp_path / "patches", centers=(0, 1), size=16)
    for center in (0, 1):
        report = CenterReport(center=center, counts={"train": {"healthy": 20, "tumor": 20},
                              "test": {"healthy": 5, "tumor": 5}},
                              patients={"train": ["x"], "test": ["y"]},
                              store=f"center_{center}.h5", patch_size=16, level=0,
                              mpp=0.25)  # fmt: skip
        report_path(stores, center).write_text(json.dumps(report.to_json()))
    _record_data(stores, {0: ("data/synthetic", True), 1: ("data/synthetic", True)})

    paths = write_report(load_runs(runs_dir), tmp_path / "results", stores, n_resamples=100)
    page = Page(paths.report_html.read_text())
    text = " ".join("".join(page.text).split())
    for table, path in (("accuracy-table", paths.accuracy_md),
                        ("clinical-table", paths.clinical_md),
                        ("per-centre-table", paths.per_centre_md),
                        ("configuration-table", paths.configuration_md)):  # fmt: skip
        assert page.tables[table] == markdown_cells(path), table
    # the majority class of the predictions (5 tumour of 8), not the reports' 10 of 20
    assert page.tables["accuracy-table"][-1][:3] == [
        "majority class (always tumour)", "—", "0.625"
    ]  # fmt: skip
    clinical = page.tables["clinical-table"]
    assert clinical[0][2:5] == ["Sensitivity [95 % CI]", "Specificity [95 % CI]", "AUC [95 % CI]"]
    assert [r[:2] for r in clinical[1:]] == [["Regular", "local"], ["ProxyFL", "private"]]
    assert clinical[1][2] == "no predictions recorded"
    assert clinical[2][2].startswith("0.600 [") and clinical[2][4].startswith("0.867 [")
    assert clinical[2][5:] == ["2", "4", "8"]
    assert page.tables["per-centre-table"][2] == [
        "ProxyFL", "private", "0.625 ± 0.125", "0.750 ± 0.000", "2"
    ]  # fmt: skip
    assert ("95 % intervals: percentile bootstrap over the 4 test patients (8 test patches)"
            in text)  # fmt: skip
    assert "100 resamples of the patients with replacement (numpy default_rng(0))" in text
    assert "Only 4 test patients: these intervals are wide" in text
    configuration = dict((r[0], r[1]) for r in page.tables["configuration-table"][1:])
    assert configuration["patches"] == "16 px at level 0 (0.25 µm/px: 4 µm)"
    assert configuration["data"] == "synthetic (wsi.synth): data/synthetic"
    assert configuration["centers"] == "0, 1"
    assert {"clinical.csv", "per_centre.csv", "configuration.md"} <= {
        Path(x).name for x in page.links
    }
