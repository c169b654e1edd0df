"""Server paths on the pages, through AppTest: the Run page's pickers offer the runs under the roots and open them
as before; a path from the page or a link that leads out of the roots (`..`, absolute, a link inside a root to
elsewhere, a scan that recorded a run elsewhere) is refused with one message whether or not it exists, shown
literally; a server beyond loopback with no roots reads none (the example and uploads still work); the roots come
from SEQIS_DATA_ROOTS, secrets.toml, or the start folder on loopback."""

import pytest

pytest.importorskip("streamlit")
from pages import APP, bound_to_url, open_view  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from seqis.runs import read_scan, scan, write_scan  # noqa: E402
from seqis.runs.example import write_prime_rl_run  # noqa: E402

ROOT = __import__("pathlib").Path(APP).resolve().parent.parent
OFF = "Paths on this server are off"
EXAMPLE = "assets/runs/prime_rl_example"  # assets/ is always read: the picker offers it too (shown from ROOT)


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """root/ (the one root): a prime-rl output folder, its scan, and a scan copied from a run outside the root
    (it records that run's path); outside/: a run and its scan."""
    tmp = tmp_path_factory.mktemp("served")
    root, outside = tmp / "root", tmp / "outside"
    write_prime_rl_run(root / "outputs" / "token_exports", steps=3, ranks=1, rollouts_per_rank=4,
                       incident=(1, "code"))
    write_prime_rl_run(outside / "run" / "token_exports", steps=2, ranks=1, rollouts_per_rank=4)
    scan(root / "outputs", ["seq_tis"], by="env_name", out=root / "scan.parquet", workers=1)
    scan(outside / "run", ["seq_tis"], by="env_name", out=outside / "scan.parquet", workers=1)
    write_scan(read_scan(outside / "scan.parquet"), root / "pointing_out.parquet")
    return root, outside


@pytest.fixture
def roots(place, monkeypatch):
    root, outside = place
    monkeypatch.setenv("SEQIS_DATA_ROOTS", str(root))
    monkeypatch.chdir(ROOT)  # the start folder: what the page shows paths relative to
    return root, outside


@pytest.fixture
def address():
    """Set Streamlit's server.address for a test (what the loopback rule reads), restored after."""
    from streamlit import config

    before = config.get_option("server.address")
    yield lambda value: config.set_option("server.address", value)
    config.set_option("server.address", before)


def run_page(**params) -> AppTest:
    return open_view("views/run.py", **params)


def test_the_pickers_offer_the_runs_and_scans_under_the_roots_and_open_them(roots):
    root, _ = roots
    at = run_page(**{"run.source": "folder"})
    picker = at.selectbox(key="run.path")
    assert picker.options == [str(root / "outputs"), EXAMPLE] and picker.value is None
    assert any(c.value.startswith("2 run folders found under") for c in at.main.caption)
    assert not at.dataframe and not at.error
    picker.set_value(str(root / "outputs")).run()
    assert not at.exception
    assert set(at.dataframe[0].value["step"]) == {1}  # the incident, as a typed path found it before
    picked = at.selectbox(key="run.path")
    assert picked.value == str(root / "outputs") and bound_to_url(picked)  # the pick is in the link
    at = run_page(**{"run.source": "file"})
    assert at.selectbox(key="run.file").options == [str(root / "pointing_out.parquet"), str(root / "scan.parquet")]
    at.selectbox(key="run.file").set_value(str(root / "scan.parquet")).run()
    assert at.dataframe[0].value.iloc[0]["step"] == 1
    labels = [b.label for b in at.button]  # the scan recorded its run folder, inside the root: its steps open
    assert labels[-2:] == ["Open step 1 in Diagnose", "Open step 1 in Explore"]


def test_paths_out_of_the_roots_get_one_message_whether_or_not_they_exist(roots):
    root, outside = roots
    folders = [str(outside / "run"), str(outside / "nowhere"), str(root / "nowhere"), f"{root}/../outside/run",
               f"{root}/outputs/../../outside/run", "/etc", str(root / "scan.parquet")]
    files = [str(outside / "scan.parquet"), str(outside / "nowhere.parquet"), str(root / "nowhere.parquet"),
             f"{root}/../outside/scan.parquet", str(root / "outputs")]
    for source, key, texts in (("folder", "run.path", folders), ("file", "run.file", files)):
        messages = set()
        for text in texts:  # as a link or a typed path sets it (AppTest cannot type a new option: a link it is)
            at = run_page(**{"run.source": source, key: text})
            assert not at.exception and not at.dataframe, text
            (error,) = at.error
            assert error.value.startswith(f"`{text}`: no "), error.value
            messages.add(error.value.replace(f"`{text}`", "PATH"))
        assert len(messages) == 1, messages
        assert f"in the folders this server reads (`{root}" in messages.pop()


def test_a_link_carries_a_path_but_not_past_the_roots_nor_onto_the_page(roots):
    root, outside = roots
    at = run_page(**{"run.source": "folder", "run.path": f"{root}/../outside/run"})
    assert not at.dataframe and "no run folder by that name" in at.error[0].value
    sneaky = "![x](http://example.invalid/p.png) [click](http://example.invalid)"
    at = run_page(**{"run.source": "folder", "run.path": sneaky})
    assert at.error[0].value.startswith(f"`{sneaky}`: ")  # a code span: no image fetched, no link drawn
    at = run_page(**{"run.source": "folder", "run.path": str(root / "outputs")})
    assert set(at.dataframe[0].value["step"]) == {1}  # a link inside the roots opens as it always did


def test_a_scan_that_recorded_a_run_out_of_the_roots_does_not_open_its_steps(roots):
    root, _ = roots
    at = run_page(**{"run.source": "file", "run.file": str(root / "pointing_out.parquet")})
    assert not at.exception and len(at.dataframe[0].value)  # the scan itself shows
    assert not [b for b in at.button if b.label.startswith("Open step")]
    assert any("not on this server" in c.value for c in at.caption)


def test_a_run_whose_step_links_out_of_the_roots_is_refused(tmp_path, place, monkeypatch):
    _, outside = place
    run = tmp_path / "run" / "token_exports"
    write_prime_rl_run(run, steps=2, ranks=1, rollouts_per_rank=4)
    (run / "step_2").symlink_to(outside / "run" / "token_exports" / "step_1")
    monkeypatch.setenv("SEQIS_DATA_ROOTS", str(tmp_path))
    at = run_page(**{"run.source": "folder", "run.path": str(tmp_path / "run")})
    assert not at.dataframe
    assert "links out of the folders this server reads" in at.error[0].value
    assert str(outside) not in at.error[0].value  # where it leads is not said
    (tmp_path / "empty").mkdir()
    at = run_page(**{"run.source": "folder", "run.path": str(tmp_path / "empty")})  # inside, but not a run
    assert not at.exception and "no steps found" in at.error[0].value


def test_beyond_loopback_with_no_roots_server_paths_are_off_and_the_page_says_how_to_enable_them(place, address,
                                                                                                  monkeypatch):
    root, _ = place
    monkeypatch.delenv("SEQIS_DATA_ROOTS", raising=False)
    monkeypatch.chdir(ROOT)
    for where in (None, "0.0.0.0"):  # unset: Streamlit listens on every interface
        address(where)
        for source, key in (("folder", "run.path"), ("file", "run.file")):
            at = run_page(**{"run.source": source, key: str(root / "outputs")})
            assert not at.dataframe and not at.error and not at.selectbox
            (info,) = [i.value for i in at.info]
            assert info.startswith(OFF)
            assert "--data-root" in info and "SEQIS_DATA_ROOTS" in info and "secrets.toml" in info
    at = run_page()  # the shipped example still opens, and its steps
    assert at.dataframe[0].value.iloc[0]["step"] == 5
    assert at.button(key="run.open.explore.py.5")
    at = run_page(**{"run.source": "upload"})
    assert at.get("file_uploader")  # uploads work as always
    address(None)
    monkeypatch.setenv("SEQIS_DATA_ROOTS", str(root))  # roots named: on beyond loopback too
    assert run_page(**{"run.source": "folder"}).selectbox(key="run.path").options == [str(root / "outputs"), EXAMPLE]


def test_on_loopback_the_default_roots_are_the_start_folder_and_assets(address, monkeypatch):
    monkeypatch.delenv("SEQIS_DATA_ROOTS", raising=False)
    monkeypatch.chdir(ROOT)
    address("127.0.0.1")
    at = run_page(**{"run.source": "folder"})
    assert "assets/runs/prime_rl_example" in at.selectbox(key="run.path").options
    at.selectbox(key="run.path").set_value("assets/runs/prime_rl_example").run()
    assert at.dataframe[0].value.iloc[0]["step"] == 5
    at = run_page(**{"run.source": "folder", "run.path": "/etc"})
    assert at.error[0].value.startswith("`/etc`: no run folder by that name")


def test_roots_from_secrets_toml(place, address, monkeypatch):
    root, _ = place
    monkeypatch.delenv("SEQIS_DATA_ROOTS", raising=False)
    monkeypatch.chdir(ROOT)
    address(None)
    at = AppTest.from_file(APP, default_timeout=120)
    at.secrets["seqis"] = {"data_roots": [str(root)]}
    at.query_params["run.source"] = "folder"
    at.switch_page("views/run.py").run()
    assert not at.exception and at.selectbox(key="run.path").options == [str(root / "outputs"), EXAMPLE]
    at = AppTest.from_file(APP, default_timeout=120)
    at.secrets["seqis"] = {"data_roots": 3}  # malformed: off, saying why
    at.query_params["run.source"] = "folder"
    at.switch_page("views/run.py").run()
    assert not at.exception and "data_roots: a list of folders, got 3" in at.info[0].value


def test_a_step_is_handed_to_explore_and_diagnose_only_from_inside_the_roots(roots):
    import pandas as pd
    from ui import run_data
    from ui.paths import Refused

    root, outside = roots
    with pytest.raises(Refused):
        run_data.hand_step_to_explore(str(outside / "run"), 0)
    with pytest.raises(Refused):
        run_data.hand_step_to_explore(f"{root}/../outside/run", 0)
    df = pd.DataFrame()
    df.attrs["path"] = str(outside / "run")
    assert run_data.run_folder_of(df, None) is None
    assert run_data.run_folder_of(df, str(root / "outputs")) == str(root / "outputs")


def test_a_value_from_a_link_is_shown_literally():
    from ui.state import literal

    assert literal("runs/a") == "`runs/a`"
    assert literal("a`b") == "``a`b``" and literal("`x`") == "`` `x` ``"  # a longer fence than any run inside
    assert literal("x" * 400).endswith("...`") and len(literal("x" * 400)) == 305
    sneaky = "![x](http://example.invalid/p.png)"
    at = open_view("views/explore.py", **{"ex.source": "upload", "ex.file": sneaky})
    assert any(f"`{sneaky}`" in i.value for i in at.info)  # Explore's "this link was made with an upload"
