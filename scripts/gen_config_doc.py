"""Regenerate the option table of docs/configuration.md from otel_training.config.options."""

from __future__ import annotations

import re
from pathlib import Path

from otel_training.config.options import markdown_table

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
BEGIN, END = "<!-- options:begin -->", "<!-- options:end -->"

text = DOC.read_text()
text = re.sub(f"{BEGIN}.*?{END}", f"{BEGIN}\n{markdown_table()}{END}", text, flags=re.S)
DOC.write_text(text)
print(f"updated {DOC}")
