"""llama-server's router mode (lab.llama_router; the presets file is specscope export's): a preset
holds a setting's exact flags."""

from __future__ import annotations

from lab.llama_router import preset_section
from specscope.serving.llamacpp.export import presets_ini
from specscope.serving.llamacpp.server import ServerSetting


def test_a_preset_holds_the_settings_exact_flags():
    section = preset_section(
        "t.gguf", ServerSetting(threads=2, poll=0, k=3, draft_poll=0), "d.gguf"
    )
    assert section["model"] == "t.gguf" and section["md"] == "d.gguf"
    assert (section["spec-draft-n-max"], section["spec-draft-p-min"], section["poll"]) == (
        "3",
        "0",
        "0",
    )
    assert "md" not in preset_section("t.gguf", ServerSetting(), "d.gguf")  # plain: no draft
    assert (
        presets_ini({"plain": {"model": "t.gguf", "t": 2}}) == "\n[plain]\nmodel = t.gguf\nt = 2\n"
    )
    assert presets_ini({"a": {"--spec-draft-p-min": 0.0}}, ["made here"]) == (
        "; made here\n\n[a]\nspec-draft-p-min = 0.0\n"
    )
