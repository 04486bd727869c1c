"""Prompts: items and JSONL files (items), where they come from (sources), the domains that
name the sources (domains), and how a model sees them (render)."""
