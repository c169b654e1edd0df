"""The rule every server path from the page passes (app/ui/paths.py), on a real folder tree: `..` segments,
absolute paths outside, a symlink inside a root that points outside, URL-encoded and `~` paths, a root given as a
relative path, one message whether or not a path exists (and nothing looked up before containment is decided);
which roots a server reads (the flag, the environment, secrets.toml, the loopback rule); and the picker's bounded
walk (depth, count, hidden folders, links out of the roots)."""

import os
import sys
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "app"))
from ui import paths  # noqa: E402
from ui.paths import Refused, confine  # noqa: E402

from seqis.io.columns import ASSETS_DIR  # noqa: E402


@pytest.fixture
def tree(tmp_path):
    """tmp/data (the root) with runs/a (a run: step_0/) and a file; tmp/secret outside it, with a run and a file;
    tmp/data2, a sibling whose name starts like the root's."""
    data, secret = tmp_path / "data", tmp_path / "secret"
    (data / "runs" / "a" / "step_0").mkdir(parents=True)
    (data / "notes.txt").write_text("inside")
    (secret / "run" / "step_0").mkdir(parents=True)
    (secret / "key.txt").write_text("outside")
    (tmp_path / "data2" / "run" / "step_0").mkdir(parents=True)
    return tmp_path, paths.roots_from(str(data), None, None, base=tmp_path, assets=tmp_path / "assets")


def message_of(text, roots, kind="path") -> str:
    with pytest.raises(Refused) as e:
        confine(text, roots, kind)
    return str(e.value)


def test_a_path_inside_a_root_resolves_and_the_resolved_path_is_returned(tree):
    tmp, roots = tree
    assert confine(str(tmp / "data" / "runs" / "a"), roots, "folder") == tmp / "data" / "runs" / "a"
    assert confine("data/runs/a", roots, "folder") == tmp / "data" / "runs" / "a"  # relative to the start folder
    assert confine("data/runs/../runs/./a/", roots, "folder") == tmp / "data" / "runs" / "a"  # `..` that stays in
    assert confine("data/notes.txt", roots, "file") == tmp / "data" / "notes.txt"


@pytest.mark.parametrize("text", ["data/../secret/run", "data/runs/a/../../../secret/run", "../secret", "/",
                                  "data/..", "data2/run", "data/../data2/run"])
def test_dot_dot_segments_and_sibling_names_out_of_the_root_are_refused(tree, text):
    _, roots = tree
    assert "no run folder by that name" in message_of(text, roots, "folder")


def test_absolute_paths_outside_are_refused_with_one_message_whether_or_not_they_exist(tree):
    tmp, roots = tree
    outside = {"existing folder": tmp / "secret" / "run", "existing file": tmp / "secret" / "key.txt",
               "missing": tmp / "secret" / "nowhere", "system": Path("/etc"), "missing inside": tmp / "data" / "x"}
    for kind in ("folder", "file", "path"):
        messages = {name: message_of(str(p), roots, kind).replace(str(p), "PATH") for name, p in outside.items()
                    if not (name == "missing inside" and kind == "path")}
        assert len(set(messages.values())) == 1, messages
    # inside, existing, but not the kind asked for: the same message again
    folder_msg = message_of(str(tmp / "secret" / "run"), roots, "folder").replace(str(tmp / "secret" / "run"), "P")
    assert message_of(str(tmp / "data" / "notes.txt"), roots, "folder").replace(str(tmp / "data" / "notes.txt"),
                                                                                   "P") == folder_msg


def test_a_nonexistent_path_inside_and_outside_get_the_same_message(tree):
    tmp, roots = tree
    inside, outside = message_of("data/not_here", roots, "folder"), message_of("secret/not_here", roots, "folder")
    assert inside.replace("data/not_here", "PATH") == outside.replace("secret/not_here", "PATH")
    assert inside.startswith("data/not_here: no run folder by that name in the folders this server reads (")
    assert inside.endswith("start the server with `python -m app --data-root FOLDER` or set SEQIS_DATA_ROOTS")


@pytest.fixture
def looked(monkeypatch):
    """Every filesystem question asked from here on: (what, path) for Path's lookups and os.lstat / os.stat (what
    os.path.realpath asks)."""
    asked = []
    for name in ("stat", "lstat", "exists", "is_dir", "is_file", "open", "iterdir", "resolve"):
        real = getattr(Path, name)
        monkeypatch.setattr(Path, name, lambda self, *a, _n=name, _r=real, **k: asked.append((_n, Path(self))) or
                            _r(self, *a, **k))
    for name in ("lstat", "stat"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda p, *a, _n=name, _r=real, **k: asked.append((_n, Path(os.fsdecode(p))))
                            or _r(p, *a, **k))
    return asked


def test_nothing_is_looked_up_before_containment_is_decided(tree, looked):
    """A path outside is refused without the filesystem being asked anything; one inside is looked up after."""
    tmp, roots = tree
    for p in (tmp / "secret" / "key.txt", tmp / "secret" / "nowhere", "data/../secret/run", "/etc/passwd"):
        with pytest.raises(Refused):
            confine(str(p), roots, "folder")
    assert looked == []
    confine("data/runs/a", roots, "folder")  # inside: resolved and looked up, after the check
    assert looked and all(tmp / "data" / "runs" / "a" == p or (tmp / "data" / "runs" / "a").is_relative_to(p)
                          for _, p in looked)


def test_a_probe_through_a_folder_outside_learns_nothing_about_it(tree, looked):
    """`/outside/x/../../data/run` is /data/run, whether x is a folder, a file, a link (that would lead elsewhere
    if followed) or nothing: resolving never walks through the folder outside."""
    tmp, roots = tree
    (tmp / "secret" / "hop").symlink_to(tmp / "secret" / "run" / "step_0")
    answers = {name: confine(f"{tmp}/secret/{name}/../../data/runs/a", roots, "folder")
               for name in ("hop", "run", "key.txt", "nowhere")}
    assert set(answers.values()) == {tmp / "data" / "runs" / "a"}
    assert not [p for _, p in looked if p.is_relative_to(tmp / "secret")]


def test_a_root_reached_through_a_link_takes_paths_by_either_name(tmp_path):
    (tmp_path / "disk" / "runs" / "a" / "step_0").mkdir(parents=True)
    (tmp_path / "data").symlink_to(tmp_path / "disk")
    roots = paths.roots_from(str(tmp_path / "data" / "runs"), None, None, base=tmp_path, assets=tmp_path / "assets")
    assert roots.paths[0] == tmp_path / "disk" / "runs"
    for text in (f"{tmp_path}/data/runs/a", f"{tmp_path}/disk/runs/a", "data/runs/a"):
        assert confine(text, roots, "folder") == tmp_path / "disk" / "runs" / "a"
    with pytest.raises(Refused):
        confine(f"{tmp_path}/data/elsewhere", roots)


def test_a_symlink_inside_a_root_that_points_outside_is_refused(tree):
    tmp, roots = tree
    (tmp / "data" / "out").symlink_to(tmp / "secret")
    (tmp / "data" / "key").symlink_to(tmp / "secret" / "key.txt")
    (tmp / "data" / "in").symlink_to(tmp / "data" / "runs")
    for text in ("data/out", "data/out/run", "data/out/nowhere", "data/key", "data/runs/../out/run"):
        with pytest.raises(Refused):
            confine(text, roots)
    assert confine("data/in/a", roots, "folder") == tmp / "data" / "runs" / "a"  # a link that stays inside
    (tmp / "data" / "deep").symlink_to(tmp / "secret" / "run" / "step_0")
    with pytest.raises(Refused):
        confine("data/deep/x", roots)
    assert confine("data/deep/..", roots) == tmp / "data"  # `..` applies to the text: the link is never read


def test_url_encoded_paths_are_decoded_once_by_the_url_layer_never_again_here(tree):
    tmp, roots = tree
    sneaky = "data/%2e%2e/secret/run"
    assert confine(sneaky, roots) == tmp / "data" / "%2e%2e" / "secret" / "run"  # a name, not a way up
    with pytest.raises(Refused):
        confine(sneaky, roots, "folder")  # and no such folder: the one message
    assert message_of(unquote(sneaky), roots, "folder") == message_of("data/../secret/run", roots, "folder")
    twice = "data/" + quote(quote("../../secret/run", safe=""), safe="")  # encoded twice: arrives encoded once
    arrived = unquote(twice)
    assert confine(arrived, roots) == tmp / "data" / quote("../../secret/run", safe="")  # one name, inside
    with pytest.raises(Refused):
        confine(arrived, roots, "folder")


def test_tilde_paths_expand_to_the_home_folder_and_pass_the_same_rule(tree, monkeypatch):
    tmp, roots = tree
    monkeypatch.setenv("HOME", str(tmp / "secret"))
    with pytest.raises(Refused):
        confine("~/run", roots, "folder")
    with pytest.raises(Refused):
        confine("~", roots)
    monkeypatch.setenv("HOME", str(tmp / "data"))
    assert confine("~/runs/a", roots, "folder") == tmp / "data" / "runs" / "a"
    home_roots = paths.roots_from("~/runs", None, None, base=tmp, assets=tmp / "assets")  # a root given with ~
    assert home_roots.paths[0] == tmp / "data" / "runs"


def test_a_root_given_as_a_relative_path_is_relative_to_the_start_folder(tree):
    tmp, _ = tree
    roots = paths.roots_from(f"data/runs{os.pathsep}./data/../data/runs{os.pathsep}", None, None, base=tmp,
                             assets=tmp / "assets")
    assert roots.paths == (tmp / "data" / "runs", tmp / "assets")  # resolved, repeated ones once, assets/ kept
    assert confine("data/runs/a", roots, "folder") == tmp / "data" / "runs" / "a"
    with pytest.raises(Refused):
        confine("data/notes.txt", roots)


def test_empty_and_nul_paths_are_refused(tree):
    _, roots = tree
    for text in ("", "   ", "data/runs\x00/a"):
        with pytest.raises(Refused):
            confine(text, roots)


def test_refusals_quote_their_paths_as_the_page_asks():
    r = paths.roots_from("/srv/runs", None, None, base=Path("/srv"))
    with pytest.raises(Refused) as e:
        confine("[x](http://example.invalid)", r)
    assert e.value.message(lambda s: f"<{s}>").startswith("<[x](http://example.invalid)>: no file or folder")
    assert "</srv/runs, " in e.value.message(lambda s: f"<{s}>")


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1", True), ("localhost", True), ("LOCALHOST", True), ("::1", True), ("[::1]", True),
    ("127.0.0.2", True), (None, False), ("", False), ("0.0.0.0", False), ("::", False), ("192.168.1.5", False),
    ("gpu-box.example", False), ("unix:///tmp/seqis.sock", False)])
def test_which_server_addresses_are_loopback(address, loopback):
    assert paths.is_loopback(address) is loopback


def test_which_roots_a_server_reads(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assets = tmp_path / "assets"

    def roots(env, secrets, address):
        return paths.roots_from(env, secrets, address, base=tmp_path, assets=assets)

    assert roots(f"{a}{os.pathsep}{b}", [str(tmp_path)], None).paths == (a, b, assets)  # the env (or flag) first
    assert roots(None, [str(a), "b"], None).paths == (a, b, assets)  # then secrets.toml's list
    assert roots("", str(a), None).paths == (a, assets)  # an empty variable is no setting; a string is a path list
    default = roots(None, None, "127.0.0.1")
    assert default.paths == (tmp_path, assets) and default.on and default.source == "default"
    off = roots(None, [], "0.0.0.0")
    assert not off.on and "0.0.0.0" in off.off and off.paths == (assets,)  # the shipped examples only
    assert "every interface" in roots(None, None, None).off
    assert roots(str(a), None, "0.0.0.0").on  # roots named: served beyond loopback too
    with pytest.raises(ValueError, match="data_roots: a list of folders"):
        roots(None, [1, 2], None)
    assert roots(str(a), [1, 2], None).paths == (a, assets)  # a bad secret under a set variable is never read
    assert paths.roots_from(None, None, "::1").paths[-1] == Path(os.path.realpath(ASSETS_DIR))


def test_the_data_root_flag_of_python_m_app(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("app_main", Path(paths.__file__).parents[1] / "__main__.py")
    main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(main)  # its top level only sets sys.path and an OpenMP default
    take_data_roots = main.take_data_roots

    roots, rest = take_data_roots(["--data-root", "runs", "--server.port", "9", "--data-root=/srv/x",
                                   "--data-root=~/y"])
    assert roots == [str(tmp_path / "runs"), "/srv/x", os.path.expanduser("~/y")] and rest == ["--server.port", "9"]
    for bad in (["--data-root"], ["--data-root", "--server.port", "9"], ["--data-root="]):
        with pytest.raises(SystemExit, match="--data-root needs a folder"):
            take_data_roots(bad)


def test_check_files_refuses_a_run_whose_step_links_out(tree, monkeypatch):
    tmp, roots = tree
    run = tmp / "data" / "runs" / "a"
    (run / "step_0" / "rank_0.jsonl").write_text("{}")
    (run / "step_1").symlink_to(tmp / "secret" / "run" / "step_0")
    (run / "step_2").mkdir()
    (run / "step_2" / "rank_0.jsonl").symlink_to(tmp / "secret" / "key.txt")
    (run / "step_3").symlink_to(run / "step_0")  # a link that stays inside
    paths.check_files([run / "step_0" / "rank_0.jsonl", run / "step_3" / "rank_0.jsonl"], roots, "runs/a")
    with pytest.raises(Refused, match="runs/a: rank_0.jsonl links out of the folders this server reads"):
        paths.check_files([run / "step_0" / "rank_0.jsonl", run / "step_1" / "rank_0.jsonl"], roots, "runs/a")
    with pytest.raises(Refused, match="rank_0.jsonl links out"):
        paths.check_files([run / "step_2" / "rank_0.jsonl"], roots, "runs/a")
    monkeypatch.chdir(tmp)  # the files of a run opened by a relative path are relative too
    paths.check_files([Path("data/runs/a/step_0/rank_0.jsonl")], roots, "runs/a")
    with pytest.raises(Refused):
        paths.check_files([Path("data/runs/a/step_1/rank_0.jsonl")], roots, "runs/a")


# ---------------------------------------------------------------------------------------------------------
# the picker's walk


@pytest.fixture
def runs(tmp_path):
    """A root with a prime-rl output folder, a folder of step dumps, a scan parquet, a batch parquet (not a
    scan), a run in a hidden folder, a run six folders down, and links: one out of the root (to a run), one
    back up (a cycle), one to a run inside."""
    import pandas as pd

    from seqis.runs import write_scan

    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "outputs" / "token_exports" / "step_0").mkdir(parents=True)
    (root / "dumps").mkdir()
    (root / "dumps" / "step_3.parquet").write_bytes(b"not read")
    (root / "scans").mkdir()
    df = pd.DataFrame({"step": [0], "group": [None], "estimator": ["seq_tis"], "kl_k3": [0.1]})
    write_scan(df, root / "scans" / "scan.parquet")
    df.to_parquet(root / "scans" / "batch.parquet")
    (root / ".hidden" / "step_0").mkdir(parents=True)
    (root / "a" / "b" / "c" / "d" / "e" / "deep" / "step_0").mkdir(parents=True)
    (outside / "run" / "step_0").mkdir(parents=True)
    write_scan(df, outside / "scan.parquet")
    (root / "out").symlink_to(outside)
    (root / "a" / "up").symlink_to(root)
    (root / "latest").symlink_to(root / "dumps")
    return root, paths.roots_from(str(root), None, None, base=tmp_path, assets=tmp_path / "no_assets")


def test_the_walk_finds_runs_and_scans_under_the_roots_only(runs):
    root, roots = runs
    found = paths.find(roots)
    assert found.folders == (root / "dumps", root / "outputs")  # `latest` is dumps again: listed once
    assert found.files == (root / "scans" / "scan.parquet",)  # a batch parquet is no scan; outside/ not followed
    assert not found.cut


def test_the_walk_is_bounded_in_depth_entries_and_results(runs):
    root, roots = runs
    deep = root / "a" / "b" / "c" / "d" / "e" / "deep"
    assert deep in paths.find(roots, depth=7).folders and deep not in paths.find(roots).folders
    few = paths.find(roots, entries=3)
    assert few.cut and len(few.folders) + len(few.files) == 0
    one = paths.find(roots, found=1)
    assert one.cut and len(one.folders) + len(one.files) == 1
    assert paths.find(roots, footers=0).files == () and paths.find(roots, footers=0).cut


def test_the_walk_finds_the_example_run_under_the_default_roots():
    roots = paths.roots_from(None, None, "127.0.0.1", base=ASSETS_DIR.parent)
    assert ASSETS_DIR / "runs" / "prime_rl_example" in paths.find(roots).folders
