"""JavaScript semantics the session model and the pi format depend on, reproduced on purpose.

``String(x)`` (:func:`js_to_string`), ``Number(x)`` (:func:`js_to_number`),
``Number.prototype.toString`` (:func:`js_number_to_string`), ``String.prototype.trim``
(:func:`js_trim`, :func:`js_trim_start`, :func:`js_trim_end`), truthiness (:func:`js_truthy`)
and ``new Date(x).getTime()`` (:func:`js_date_ms`), each for the JSON values pi reads.
:data:`MISSING` stands for ``undefined``: a field that is absent.

Pure: no I/O, no imports from the store.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final

__all__ = [
    "JS_WHITESPACE",
    "MISSING",
    "js_date_ms",
    "js_number_to_string",
    "js_to_number",
    "js_to_string",
    "js_trim",
    "js_trim_end",
    "js_trim_start",
    "js_truthy",
]

#: JavaScript's ``undefined``: what ``entry.get(key, MISSING)`` gives for an absent field.
MISSING: Final = object()

# ECMAScript WhiteSpace + LineTerminator: what String.prototype.trim removes. Not the same set
# as Python's str.strip() (which also strips U+001C-U+001F and U+0085, and misses U+FEFF).
JS_WHITESPACE: Final = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def js_trim(text: str) -> str:
    """``String.prototype.trim``."""
    return text.strip(JS_WHITESPACE)


def js_trim_start(text: str) -> str:
    """``String.prototype.trimStart``."""
    return text.lstrip(JS_WHITESPACE)


def js_trim_end(text: str) -> str:
    """``String.prototype.trimEnd``."""
    return text.rstrip(JS_WHITESPACE)


def js_truthy(value: Any) -> bool:
    """JavaScript truthiness of a JSON value (``""``, ``0``, ``null`` and NaN are falsy; ``[]`` is not)."""
    if value is None or value is MISSING:
        return False
    if value is True or value is False:
        return bool(value)
    if isinstance(value, (int, float)):
        return value != 0 and not math.isnan(value)
    if isinstance(value, str):
        return value != ""
    return True


def js_number_to_string(value: float) -> str:
    """``Number.prototype.toString()`` (and so ``JSON.stringify``) of a finite double.

    Python's ``repr`` and JS both pick the shortest digit string that round-trips (ties to the
    nearest), so only the layout differs: JS writes plain digits for exponents -7 < e < 21.
    """
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return "null"  # what JSON.stringify writes for NaN and +-Infinity
    text = repr(value)
    sign = ""
    if text[0] == "-":
        sign, text = "-", text[1:]
    mantissa, _, exp_text = text.partition("e")
    exponent = int(exp_text) if exp_text else 0
    int_part, _, frac_part = mantissa.partition(".")
    if frac_part == "0":
        frac_part = ""
    digits = (int_part + frac_part).lstrip("0")
    # n: position of the decimal point relative to the first significant digit (ECMA-262 n).
    if int_part.strip("0"):
        n = len(int_part.lstrip("0")) + exponent
    else:
        n = exponent - (len(frac_part) - len(frac_part.lstrip("0")))
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        out = (
            digits[0]
            + ("." + digits[1:] if k > 1 else "")
            + "e"
            + ("+" if e >= 0 else "-")
            + str(abs(e))
        )
    return sign + out


def js_to_string(value: Any) -> str:
    """``String(value)`` for a JSON value (arrays join their elements with ``,``)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return js_number_to_string(float(value)) if abs(value) > 2**53 else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return js_number_to_string(value)
    if isinstance(value, (list, tuple)):
        # Array.prototype.join: null and undefined elements become "".
        return ",".join("" if item is None else js_to_string(item) for item in value)
    return "[object Object]"


def js_to_number(value: Any) -> float:
    """``ToNumber`` of a JSON value (``"2"`` -> 2, ``[3]`` -> 3, ``"abc"`` -> NaN, ``null`` -> 0)."""
    if value is None:
        return 0.0
    if value is True or value is False:
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, list):
        return _string_to_number(js_to_string(value))  # ToPrimitive joins the elements
    if isinstance(value, str):
        return _string_to_number(value)
    return math.nan  # "[object Object]"


# StrNumericLiteral (ASCII digits only: Python's float() would also take "١٢" or "1_0").
_DECIMAL_LITERAL = re.compile(
    r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)\Z", re.ASCII
)
_RADIX_LITERAL = re.compile(r"0(?:[xX][0-9a-fA-F]+|[oO][0-7]+|[bB][01]+)\Z")


def _string_to_number(text: str) -> float:
    text = js_trim(text)
    if text == "":
        return 0.0
    if text in ("Infinity", "+Infinity"):
        return math.inf
    if text == "-Infinity":
        return -math.inf
    if _RADIX_LITERAL.match(text):
        return float(int(text, 0))
    if _DECIMAL_LITERAL.match(text):
        return float(text)
    return math.nan


# --- new Date(x).getTime() ---------------------------------------------------------------------

_MS_PER_DAY: Final = 86_400_000
_MAX_TIME: Final = 8.64e15

# The canonical toISOString() shape: almost every timestamp pi writes, so it gets a fast path.
_ISO_FAST = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{3})Z\Z", re.ASCII)

# V8's ES5 date-time parser (DateParser::ParseES5DateTime): YYYY or ±YYYYYY, optional -MM and
# -DD, optional THH:mm[:ss[.fraction]] and Z or ±hh:mm / ±hhmm. Keywords are case-insensitive.
_ISO_FULL = re.compile(
    r"""
    (?:(?P<sign>[+-])(?P<ey>\d{6})|(?P<y>\d{4}))
    (?:-(?P<mo>\d{2})(?:-(?P<d>\d{2}))?)?
    (?:[Tt]
        (?P<h>\d{2}):(?P<mi>\d{2})
        (?::(?P<s>\d{2})(?:\.(?P<f>\d+))?)?
        (?P<tz>[Zz]|[+-]\d{2}:?\d{2})?
    )?
    \Z
    """,
    re.VERBOSE | re.ASCII,  # \d must not match non-ASCII digits, which V8 rejects
)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date; ``day`` may overflow the month."""
    y = year - (month <= 2)
    era = y // 400  # floor division: no C-style correction needed for negative years
    yoe = y - era * 400
    mp = (month + 9) % 12
    doy = (153 * mp + 2) // 5
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    # Adding (day - 1) after the month start reproduces MakeDay's overflow (Feb 30 -> Mar 2).
    return era * 146097 + doe - 719468 + (day - 1)


def _time_clip(ms: float) -> int | None:
    if not math.isfinite(ms) or abs(ms) > _MAX_TIME:
        return None
    return int(ms)  # ToIntegerOrInfinity truncates toward zero; -0 becomes 0


def _parse_date_string(text: str) -> int | None:
    m = _ISO_FAST.match(text)
    if m is not None:
        y, mo, d, h, mi, s, f = (int(g) for g in m.groups())
        if not (1 <= mo <= 12 and 1 <= d <= 31 and mi <= 59 and s <= 59):
            return None
        if h > 24 or (h == 24 and (mi or s or f)):
            return None
        days = _days_from_civil(y, mo, d)
        return _time_clip(days * _MS_PER_DAY + h * 3_600_000 + mi * 60_000 + s * 1000 + f)
    m = _ISO_FULL.match(text)
    if m is None:
        # V8 would hand the string to its legacy, locale- and time-zone-dependent parser
        # ("March 1, 2025", "2025/03/01 10:00", ...). We do not: such strings give NaN.
        return None
    if m["ey"] is not None:
        year = int(m["ey"])
        if m["sign"] == "-":
            if year == 0:
                return None  # "-000000" is explicitly invalid
            year = -year
    else:
        year = int(m["y"])
    month = int(m["mo"]) if m["mo"] else 1
    day = int(m["d"]) if m["d"] else 1
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    ms = 0
    offset_min = 0
    if m["h"] is not None:
        hour, minute = int(m["h"]), int(m["mi"])
        second = int(m["s"]) if m["s"] else 0
        # V8 reads the first three fraction digits (padding shorter ones) and ignores the rest.
        frac = int((m["f"] or "")[:3].ljust(3, "0"))
        if hour > 24 or minute > 59 or second > 59:
            return None
        if hour == 24 and (minute or second or frac):
            return None
        tz = m["tz"]
        if tz and tz not in ("Z", "z"):
            digits = tz[1:].replace(":", "")
            tz_h, tz_m = int(digits[:2]), int(digits[2:])
            if tz_h > 23 or tz_m > 59:
                return None
            offset_min = (tz_h * 60 + tz_m) * (1 if tz[0] == "+" else -1)
        # A date-time without offset is LOCAL time in JavaScript. pi's output depends on the
        # machine's time zone there; we use UTC so that results are reproducible.
        ms = hour * 3_600_000 + minute * 60_000 + second * 1000 + frac
    days = _days_from_civil(year, month, day)
    return _time_clip(days * _MS_PER_DAY + ms - offset_min * 60_000)


def js_date_ms(value: Any = MISSING) -> int | None:
    """``new Date(value).getTime()`` for a JSON value; ``None`` stands for NaN.

    Call without argument for ``new Date(undefined)`` (a missing field), which is NaN, while
    ``null`` is 0. Strings follow V8's ISO parser; see the notes in ``docs/pi-format.md`` for
    the non-ISO strings V8's legacy parser accepts and this function does not.
    """
    if value is MISSING:
        return None
    if value is None:
        return 0
    if value is True or value is False:
        return int(value)
    if isinstance(value, int) and abs(value) > _MAX_TIME:
        return None  # beyond TimeClip's range (and perhaps beyond a double)
    if isinstance(value, (int, float)):
        return _time_clip(float(value))
    if isinstance(value, str):
        return _parse_date_string(value)
    # Objects go through ToPrimitive: arrays become their joined string, objects
    # "[object Object]" (never a date).
    return _parse_date_string(js_to_string(value))
