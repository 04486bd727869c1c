"""The llama.cpp export read the way llama-server b11312 reads it, from llama.cpp's own code.

Fixtures under tests/data/engines/ are excerpts of ggml-org/llama.cpp at
0c1e57098bba43ac29e6e3b677cdceebdd22334f (b11312, vendored by llama-cpp-python 0.3.36):
- llama.cpp-b11312-arg-names.txt: every option's alias list from common/arg.cpp;
- llama.cpp-b11312-spec-types.txt: the --spec-type names from common/speculative.cpp.
The presets file is parsed with the grammar of common/preset.cpp ``parse_ini_from_file`` (header
``[ name ]``, ``ident = value`` with ident ``[a-zA-Z_][a-zA-Z0-9_.-]*``, ``;``/``#`` comments) and
its keys are matched as ``load_from_ini`` does: a flag alias without its leading dashes, anything
else "not recognized in preset". When a built llama-server is given (SPECSCOPE_LLAMA_SERVER, or
llama-server on PATH), its --help and a router-mode start with the presets file are checked too.
"""

import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from specscope.drafters import DrafterConfig
from specscope.serving.export import ENGINES, ExportError, ExportOptions, export_policy
from specscope.trees import TreeShape
from specscope.tune.policy import PolicyFile

DATA = Path(__file__).parents[1] / "data" / "engines"
CHAIN3 = TreeShape.from_paths([(0,), (0, 0), (0, 0, 0)])
CHAIN1 = TreeShape.from_paths([(0,)])


def _aliases() -> list[list[str]]:
    rows = []
    for line in (DATA / "llama.cpp-b11312-arg-names.txt").read_text().splitlines():
        if line.startswith("{"):
            rows.append(re.findall(r'"(-[^"]*)"', line.split("}")[0]))
    return rows


def _preset_keys() -> dict[str, str]:
    """preset key -> the option's last alias (common/preset.cpp get_map_key_opt, to_args)."""
    return {alias.lstrip("-"): names[-1] for names in _aliases() for alias in names}


def parse_presets(text: str) -> dict[str, dict[str, str]]:
    """common/preset.cpp parse_ini_from_file: sections of key = value; a bad line is an error."""
    sections: dict[str, dict[str, str]] = {}
    current = "default"
    for line in text.splitlines():
        if re.fullmatch(r"[ \t]*([;#].*)?", line):
            continue
        header = re.fullmatch(r"\[[ \t]*([^\]]+?)[ \t]*\][ \t]*([;#].*)?", line)
        if header:
            current = header.group(1)
            sections[current] = {}
            continue
        kv = re.fullmatch(r"([a-zA-Z_][a-zA-Z0-9_.-]*)[ \t]*=[ \t]*(.*?)[ \t]*([;#].*)?", line)
        if not kv:
            raise ValueError(f"failed to parse server config file at {line!r}")
        sections.setdefault(current, {})[kv.group(1)] = kv.group(2)
    return sections


def _export():
    """code: the draft model, K = 3; math: ngram-simple (N = 1, M = 1); reasoning: the uniform
    draft-model chain; chat: plain."""
    policy = PolicyFile(
        trees={"code": CHAIN3, "math": CHAIN1, "chat": None},
        uniform=CHAIN1,
        drafters={"math": DrafterConfig("ngram", prompt_lookup_min=1, prompt_lookup_max=3)},
    )
    return export_policy(
        policy, "llama.cpp", ExportOptions(draft="/m/draft.gguf", target="/m/target.gguf")
    )


def test_every_exported_flag_is_a_llama_server_b11312_option():
    aliases = {a for names in _aliases() for a in names}
    assert {"--spec-draft-n-max", "-md", "--spec-type", "--models-preset"} <= aliases
    assert {"--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m"} <= aliases
    version = ENGINES["llama.cpp"].version("b11312")
    assert set(version.field_names) <= aliases
    for domain in _export()["domains"].values():
        flags = [a for a in domain["server_args"][1:] if a.startswith("--")]
        assert set(flags) <= aliases


def test_presets_file_parses_as_llama_server_b11312_reads_it():
    doc = _export()
    sections = parse_presets(doc["presets_ini"])
    keys = _preset_keys()
    assert list(sections) == ["code", "math", "reasoning", "chat"]
    for name, options in sections.items():
        for key in options:
            assert key in keys, f"option '{key}' not recognized in preset '{name}'"
    assert {keys[k]: v for k, v in sections["code"].items()} == {
        "--model": "/m/target.gguf",
        "--spec-type": "draft-simple",
        "--model-draft": "/m/draft.gguf",
        "--spec-draft-n-max": "3",
        "--spec-draft-n-min": "0",
        "--draft-p-min": "0.0",
        "--poll": "0",
        "--poll-draft": "0",
    }
    assert {keys[k]: v for k, v in sections["math"].items()} == {
        "--model": "/m/target.gguf",
        "--spec-type": "ngram-simple",
        "--spec-ngram-simple-size-n": "1",
        "--spec-ngram-simple-size-m": "1",
    }
    assert sections["chat"] == {"model": "/m/target.gguf"}


def test_spec_type_names_are_llama_cpp_b11312s():
    text = (DATA / "llama.cpp-b11312-spec-types.txt").read_text()
    names = re.findall(r'\{"([a-z0-9-]+)",\s+COMMON_SPECULATIVE_TYPE', text)
    version = ENGINES["llama.cpp"].version("b11312")
    assert tuple(names) == version.field_names["--spec-type"].choices


@pytest.mark.llamacpp
def test_llama_server_accepts_presets(tmp_path):
    from conftest import llama_tools

    server = str(llama_tools().path("llama-server"))
    help_text = subprocess.run(
        [server, "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for flag in (
        "--spec-draft-n-max",
        "--spec-draft-n-min",
        "--spec-draft-p-min",
        "--spec-type",
        "--models-preset",
        "-md,",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        "--spec-ngram-simple-size-m",
    ):
        assert flag in help_text
    presets = tmp_path / "presets.ini"
    presets.write_text(_export()["presets_ini"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            server,
            "--models-preset",
            str(presets),
            "--no-models-autoload",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        import urllib.request

        deadline, models = time.monotonic() + 60, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/models", timeout=2) as r:
                    models = r.read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert models is not None, proc.communicate(timeout=5)[0] if proc.poll() is not None else ""
        for domain in ("code", "math", "reasoning", "chat"):
            assert f'"{domain}"' in models
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_llamacpp_policy_exports_exactly_the_flags_it_measured():
    """`specscope llamacpp` writes each domain's measured setting (short flags, models apart)
    into the policy; the export turns them into the long names presets take, with the models."""
    from specscope.serving.llamacpp.server import ServerSetting

    code = ServerSetting(threads=2, poll=0, batch=512, ubatch=128).with_k(3)
    plain = ServerSetting(threads=2, poll=50, batch=2048, ubatch=512)
    entry = {
        "setting": code.name,
        "k": 3,
        "flags": code.flags(),
        "target_gguf": "/m/t-q4_0.gguf",
        "draft_gguf": "/m/d.gguf",
    }
    none = {
        "setting": plain.name,
        "k": 0,
        "flags": plain.flags(),
        "target_gguf": "/m/t.gguf",
        "draft_gguf": None,
    }
    policy = PolicyFile(
        trees={"code": CHAIN3, "chat": None},
        uniform=None,
        info={"llama_server": {"domains": {"code": entry, "chat": none}, "fallback": none}},
    )
    doc = export_policy(policy, "llama.cpp", ExportOptions(target="/m/other.gguf"))
    sections = parse_presets(doc["presets_ini"])
    keys = _preset_keys()
    for name, options in sections.items():
        assert all(k in keys for k in options), name
    flags = doc["domains"]["code"]["flags"]
    assert flags["--model"] == "/m/t-q4_0.gguf" and flags["--spec-draft-model"] == "/m/d.gguf"
    assert (
        flags["--threads"],
        flags["--batch-size"],
        flags["--ubatch-size"],
        flags["--poll"],
        flags["--spec-draft-n-max"],
        flags["--spec-type"],
    ) == (2, 512, 128, 0, 3, "draft-simple")
    chat = doc["domains"]["chat"]["flags"]
    assert chat["--model"] == "/m/t.gguf" and chat["--poll"] == 50 and "--spec-type" not in chat
    # the measured K must be the policy's chain
    policy = PolicyFile(trees={"code": CHAIN1}, uniform=None, info=policy.info)
    with pytest.raises(
        ExportError, match="K = 1 but its llama_server setting was measured with K = 3"
    ):
        export_policy(policy, "llama.cpp", ExportOptions())


def test_llama_ngram_simple_exports_exactly_and_only_to_llama_cpp():
    """The llama-ngram-simple drafter measures llama.cpp's own rule: its domain exports as
    ngram-simple with N = ngram_size and M = the chain, not approximated; vLLM refuses it."""
    chain = TreeShape.chain(12)
    policy = PolicyFile(
        trees={"code": chain, "math": None, "reasoning": None, "chat": None},
        drafters={"code": DrafterConfig("llama-ngram-simple", ngram_size=3)},
    )
    doc = export_policy(policy, "llama.cpp", ExportOptions(target="/m/target.gguf"))
    code = doc["domains"]["code"]
    assert code["flags"] == {
        "--model": "/m/target.gguf",
        "--spec-type": "ngram-simple",
        "--spec-ngram-simple-size-n": 3,
        "--spec-ngram-simple-size-m": 12,
    }
    assert code["approximated"] is False and doc["approximation"] is None
    with pytest.raises(ExportError, match="llama.cpp's own rule: export this policy with --to"):
        export_policy(policy, "vllm", ExportOptions(target="/m/target"))
