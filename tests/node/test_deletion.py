"""fleet/node/deletion.py: what the janitor and cleanup may delete, judged before anything connects.

The glob check is exact (an automaton search), so it is compared with a brute force over short
names; the state-path rules are checked case by case; and the command line is driven through
`fleet.cli.main` with an inventory of unroutable hosts: a refused run exits 2 (command line) or
1 (inventory), with one error line and a hint, and builds no SSH transport.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.cli import main
from fleet.core.playbook import load_playbook, remote_dir
from fleet.node import deletion

JANITOR_SH = remote_dir() / "janitor-loop.sh"
DEFAULT_DELETES = load_playbook("janitor").vars["delete_patterns"]
DEFAULT_KEEPS = load_playbook("janitor").vars["keep_patterns"]

# ------------------------------------------------------------------------------ delete globs


@pytest.mark.parametrize(
    ("glob", "names"),
    [
        ("*.*", ["*.safetensors", "pytorch_model*.bin", "*config.json", "tokenizer*.json"]),
        ("[!.]*", ["*.safetensors", "pytorch_model*.bin", "*config.json", "merges.txt"]),
        ("*.bin", ["pytorch_model*.bin", "model*.bin", "adapter_model*.bin"]),
        ("*.json", ["*.index.json", "*config.json", "special_tokens_map.json", "params.json"]),
        # no example name matches this one; the patterns intersect all the same
        ("model-0000[1-4]-of-00004.safetensors", ["*.safetensors"]),
        ("*.[sS]afetensors", ["*.safetensors"]),
        ("consolidated.0?.pth", ["consolidated*.pth"]),
    ],
)
def test_a_delete_glob_that_takes_final_weights_or_configs_names_them(
    glob: str, names: list[str]
) -> None:
    taken = deletion.protected_matches(glob)
    assert set(names) <= set(taken), taken
    (problem,) = deletion.janitor_glob_problems([glob], [], allow_weights=False)
    assert problem.startswith(f"--delete '{glob}' would delete final model weights or configs: ")
    for name in names:
        assert name in problem


def test_the_default_globs_take_no_protected_file() -> None:
    assert deletion.janitor_glob_problems(DEFAULT_DELETES, DEFAULT_KEEPS, False) == []
    for glob in ["optimizer.pt", "*_optim_states.pt", "*.pt", "rng_state*.pth", "*.pth.tmp"]:
        assert deletion.protected_matches(glob) == [], glob


def test_keep_globs_that_save_every_protected_file_lift_the_refusal() -> None:
    keeps = ["pytorch_model*.bin", "model*.bin", "adapter_model*.bin"]
    assert deletion.janitor_glob_problems(["*.bin"], keeps, False) == []
    # a keep glob that saves only some of them leaves the rest named
    assert deletion.protected_matches("*.bin", ["pytorch_model*.bin"]) == [
        "model*.bin",
        "adapter_model*.bin",
    ]


def test_allow_weights_lifts_the_weights_refusal_but_not_matching_every_file() -> None:
    assert deletion.janitor_glob_problems(["*.*", "[!.]*"], [], allow_weights=True) == []
    assert deletion.janitor_glob_problems(["*"], [], allow_weights=True) == [
        "--delete '*' matches every file: name what to delete"
    ]


def test_a_glob_too_intricate_to_judge_is_refused_not_waved_through() -> None:
    glob = "x" * 2000 + "*"  # longer than any file name: the search would be pointless
    assert deletion.janitor_glob_problems([glob], [], allow_weights=False) == [
        f"--delete '{glob}' is too intricate to check for model weights"
    ]
    assert deletion.janitor_glob_problems([glob], [], allow_weights=True) == []


@pytest.mark.parametrize("glob", ["*", "?*", "*[!/]", "**", "*?"])
def test_globs_matching_every_name_are_found(glob: str) -> None:
    assert deletion.matches_every_name(glob)


@pytest.mark.parametrize("glob", ["*.*", "[!.]*", "?", "??*", "*x", "[a-z]*"])
def test_globs_missing_some_name_do_not_match_every_name(glob: str) -> None:
    assert not deletion.matches_every_name(glob)


# Small globs over a three-letter alphabet (plus "c", standing for every other character):
# the automaton must agree with fnmatch on every name up to a length no shortest witness
# exceeds (one character per token of all the globs, plus one).
_TOKENS = st.sampled_from(["a", "b", ".", "*", "?", "[ab]", "[!a]", "[.-b]"])
_GLOBS = st.lists(_TOKENS, min_size=1, max_size=2)


def _brute(required: list[str], forbidden: list[str], longest: int) -> bool:
    req = [re.compile(fnmatch.translate(g)) for g in required]
    forb = [re.compile(fnmatch.translate(g)) for g in forbidden]
    for length in range(1, longest + 1):
        for letters in itertools.product("ab.c", repeat=length):
            name = "".join(letters)
            if all(r.match(name) for r in req) and not any(f.match(name) for f in forb):
                return True
    return False


@settings(max_examples=150, deadline=None)
@given(delete=_GLOBS, protected=_GLOBS, keep=st.lists(_GLOBS, max_size=1))
def test_the_glob_search_agrees_with_brute_force(
    delete: list[str], protected: list[str], keep: list[list[str]]
) -> None:
    longest = len(delete) + len(protected) + sum(len(k) for k in keep) + 1
    required = ["".join(delete), "".join(protected)]
    forbidden = ["".join(k) for k in keep]
    expected = _brute(required, forbidden, longest)
    assert deletion._some_name(required, forbidden) == expected


def _shell_names() -> list[str]:
    text = JANITOR_SH.read_text()
    match = re.search(r"^PROTECTED_NAMES='(.*?)'$", text, re.S | re.M)
    assert match, "PROTECTED_NAMES not found in janitor-loop.sh"
    return match.group(1).split()


def test_the_node_s_protected_names_and_fleet_s_patterns_are_in_step() -> None:
    """Every name janitor-loop.sh protects is under one of fleet's patterns (so the node never
    refuses what fleet let through) and every pattern has a name on the node."""
    names = _shell_names()
    for name in names:
        assert any(fnmatch.fnmatchcase(name, g) for g in deletion.PROTECTED_GLOBS), name
    for glob in deletion.PROTECTED_GLOBS:
        assert any(fnmatch.fnmatchcase(n, glob) for n in names), glob


# ------------------------------------------------------------------------------ state paths


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/opt/*", "not where training state lives"),
        ("/usr/../opt", "/opt: not where training state lives"),
        ("/tmp/../etc/x", "/etc/x: not where training state lives"),
        ("/tmp", "not where training state lives"),
        ("/tmp/", "not where training state lives"),
        ("/tmp/.", "/tmp: not where training state lives"),
        ("/dev/shm", "not where training state lives"),
        ("~", "not where training state lives"),
        ("~/.cache", "not where training state lives"),
        ("~/.ssh/id_rsa", "not where training state lives"),
        ("/home/alice/.nv", "not where training state lives"),
        ("/t?p/x", "not where training state lives"),
        ("/tmp/*", "'*' matches everything in /tmp"),
        ("/tmp/.*", "'.*' matches everything in /tmp"),
        ("/var/tmp/[!.]*", "'[!.]*' matches everything in /var/tmp"),
        ("//tmp//*/x", "'*' matches everything in /tmp"),
        ("~/.cache/*", "'*' matches everything in ~/.cache"),
        ("tmp/x", "is relative"),
        ("~alice/.nv", "is relative"),
        ("~/../../tmp/x", "climbs out of ~"),
        ("", "is empty"),
    ],
)
def test_state_paths_outside_the_places_training_state_lives_are_refused(
    path: str, why: str
) -> None:
    problem = deletion.state_path_problem(path)
    assert problem is not None
    assert why in problem, problem


@pytest.mark.parametrize(
    "path",
    [
        "/tmp/cuda_*",
        "//tmp//./cuda_*",
        "/tmp/x/../torch_y",
        "/dev/shm/torch_*",
        "/var/tmp/job-1",
        "~/.nv",
        "~/.nv/ComputeCache",
        "~/.triton",
        "~/.cache/torch_extensions",
        "/tmp/*_x/y",
    ],
)
def test_state_paths_where_training_state_lives_pass(path: str) -> None:
    assert deletion.state_path_problem(path) is None


@pytest.mark.parametrize("name", ["cleanup", "preflight"])
def test_the_shipped_state_paths_all_pass(name: str) -> None:
    paths = load_playbook(name).vars["state_paths"]
    assert paths
    assert {p: deletion.state_path_problem(p) for p in paths} == dict.fromkeys(paths)


# ------------------------------------------------------------------------------ the command line

INVENTORY = """\
all:
  vars:
    output_dir: /data/ckpt
  hosts:
    gpu[01-02].invalid:
      ansible_host: 192.0.2.1
  children:
    odd:
      hosts:
        gpu03.invalid:
          ansible_host: 192.0.2.3
          delete_patterns: ["*.*"]
          state_paths: [/usr/../opt]
"""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("FLEET_INVENTORY", "FLEET_SSH_CONFIG", "FLEET_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEET_LOG_DIR", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def inv(write: Callable[[str, str], Path]) -> Path:
    return write("inventory.yaml", INVENTORY)


@pytest.fixture
def fleet(
    capsys: pytest.CaptureFixture[str], mocker, inv: Path
) -> Callable[..., tuple[int, str, str]]:
    """`fleet ARGS -i inventory`: (exit code, stdout, stderr); no SSH transport may be built."""
    mocker.patch(
        "fleet.ssh.transport.SSHTransport",
        side_effect=AssertionError("a refused run must not create a transport"),
    )

    def _run(*argv: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as info:
            main([*argv, "-i", str(inv)])
        out, err = capsys.readouterr()
        assert isinstance(info.value.code, int)
        return info.value.code, out, err

    return _run


def _one_error(err: str) -> tuple[str, str]:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2, err
    assert lines[0].startswith("fleet: error: "), err
    assert lines[1].strip().startswith("hint: "), err
    return lines[0], lines[1]


@pytest.mark.parametrize("action", ["start", "run-once"])
@pytest.mark.parametrize("glob", ["*.*", "[!.]*"])
def test_janitor_refuses_a_glob_that_takes_weights_before_connecting(
    fleet: Callable[..., tuple[int, str, str]], action: str, glob: str
) -> None:
    code, out, err = fleet("janitor", action, "-l", "gpu01.invalid", "--delete", glob, "--yes")
    assert code == 2
    error, hint = _one_error(err)
    assert f"--delete '{glob}' would delete final model weights or configs: " in error
    for name in ("*.safetensors", "pytorch_model*.bin", "*config.json"):
        assert name in error
    assert "--allow-weights" in hint
    assert "exact resume" not in err  # no warning about a trade that is not made
    assert out == ""


def test_janitor_glob_from_a_var_is_refused_too(
    fleet: Callable[..., tuple[int, str, str]],
) -> None:
    code, _, err = fleet(
        "janitor", "run-once", "-l", "gpu01.invalid", "--var", "delete_patterns=[x.pt, '*.bin']"
    )
    assert code == 2
    assert (
        "--delete '*.bin' would delete final model weights or configs: pytorch_model*.bin"
        in (_one_error(err)[0])
    )


def test_janitor_glob_from_the_inventory_exits_1_naming_the_hosts(
    fleet: Callable[..., tuple[int, str, str]],
) -> None:
    code, _, err = fleet("janitor", "start", "--yes")
    assert code == 1
    error, _ = _one_error(err)
    assert "--delete '*.*'" in error
    assert "inventory vars of gpu03.invalid" in error


def test_allow_weights_lets_the_glob_through_and_stop_is_never_refused(
    fleet: Callable[..., tuple[int, str, str]],
) -> None:
    code, out, err = fleet("janitor", "start", "--delete", "*.*", "--allow-weights", "-n")
    assert code == 0, err
    assert "--delete '*.*'" in out
    assert "--allow-weights" in out
    code, out, err = fleet(
        "janitor", "start", "-l", "gpu03.invalid", "--var", "allow_weights=1", "-n"
    )
    assert code == 0, err
    assert "--allow-weights" in out
    code, _, err = fleet("janitor", "stop", "-l", "gpu03.invalid", "-n")
    assert code == 0, err


def test_janitor_defaults_pass(fleet: Callable[..., tuple[int, str, str]]) -> None:
    code, out, err = fleet("janitor", "start", "-l", "gpu01.invalid", "-n")
    assert code == 0, err
    assert "--delete '*_optim_states.pt'" in out


@pytest.mark.parametrize("command", [["cleanup"], ["run", "cleanup"]])
def test_cleanup_refuses_a_state_path_from_the_command_line_with_exit_2(
    fleet: Callable[..., tuple[int, str, str]], command: list[str]
) -> None:
    code, out, err = fleet(
        *command, "-l", "gpu01.invalid", "--var", "state_paths=[/tmp/cuda_*, /opt/*]", "--yes"
    )
    assert code == 2
    error, hint = _one_error(err)
    assert "state path '/opt/*': not where training state lives" in error
    assert "cuda" not in error
    assert "allow_any_state_path=true" in hint
    assert out == ""


def test_cleanup_refuses_a_state_path_from_the_inventory_with_exit_1(
    fleet: Callable[..., tuple[int, str, str]],
) -> None:
    code, _, err = fleet("cleanup", "-n")
    assert code == 1
    error, _ = _one_error(err)
    assert "state path '/usr/../opt': /opt: not where training state lives" in error
    assert "inventory vars of gpu03.invalid" in error


def test_allow_any_state_path_lets_it_through_to_the_node(
    fleet: Callable[..., tuple[int, str, str]],
) -> None:
    code, out, err = fleet("cleanup", "-n", "--var", "allow_any_state_path=true")
    assert code == 0, err
    assert "remove PATH... (anywhere: allow_any_state_path)" in out
    code, out, err = fleet("cleanup", "-l", "gpu01.invalid", "-n")
    assert code == 0, err
    assert "(anywhere: allow_any_state_path)" not in out
