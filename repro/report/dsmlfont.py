"""A tiny web font with DSML's own characters, embedded in every report so they render without CJK fonts.

DeepSeek's markup uses the fullwidth bar `｜` (U+FF5C) and `▁` (U+2581); a machine without a CJK font
shows the bar as an empty box, and the markup becomes unreadable exactly where it matters. The font
holds those glyphs only (drawn as plain rectangles) and is declared with a `unicode-range`, so every
other character keeps the reader's own fonts and the text stays the model's (copy and search work).
Built with fontTools (a dependency of matplotlib) once per process.
"""

from __future__ import annotations

import base64
import functools
import io

from fontTools.fontBuilder import FontBuilder
from fontTools.pens.ttGlyphPen import TTGlyphPen

FAMILY = "repro-dsml"
UNITS_PER_EM = 1000
ADVANCE = 1000
"""A fullwidth character takes a whole em, as in CJK fonts."""
GLYPHS = {
    0xFF5C: ("fullwidthbar", (440, -120, 560, 820)),
    0x2581: ("lowereighth", (0, -200, 1000, -75)),
}
"""Code point: glyph name and the rectangle (x0, y0, x1, y1) drawn for it."""


def _rectangle(box: tuple[int, int, int, int]) -> object:
    pen = TTGlyphPen(None)
    x0, y0, x1, y1 = box
    pen.moveTo((x0, y0))
    pen.lineTo((x0, y1))
    pen.lineTo((x1, y1))
    pen.lineTo((x1, y0))
    pen.closePath()
    return pen.glyph()


@functools.cache
def font_data_uri() -> str:
    """The font as a `data:font/ttf;base64,…` URI."""
    names = [".notdef", *(name for name, _ in GLYPHS.values())]
    builder = FontBuilder(UNITS_PER_EM, isTTF=True)
    builder.setupGlyphOrder(names)
    builder.setupCharacterMap({code: name for code, (name, _) in GLYPHS.items()})
    glyphs = {".notdef": _rectangle((100, 0, 500, 700))}
    glyphs.update({name: _rectangle(box) for name, box in GLYPHS.values()})
    builder.setupGlyf(glyphs)
    builder.setupHorizontalMetrics({name: (ADVANCE, 0) for name in names})
    builder.setupHorizontalHeader(ascent=880, descent=-240)
    builder.setupNameTable({"familyName": FAMILY, "styleName": "Regular"})
    builder.setupOS2(sTypoAscender=880, sTypoDescender=-240, usWinAscent=880, usWinDescent=240)
    builder.setupPost()
    out = io.BytesIO()
    builder.save(out)
    return "data:font/ttf;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def font_face_css() -> str:
    """The `@font-face` rule; list FAMILY first in a font-family and it serves only these characters."""
    ranges = ", ".join(f"U+{code:04X}" for code in GLYPHS)
    return f'@font-face {{ font-family: "{FAMILY}"; src: url({font_data_uri()}) format("truetype"); unicode-range: {ranges}; }}'
