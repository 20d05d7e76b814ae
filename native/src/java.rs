//! The parts of a change event in `mongocdc.event.format=debezium_3x`: BSON as the MongoDB Java
//! driver's `JsonWriter` writes it, byte for byte what `mongocdc_core.events.javajson` writes of
//! the decoded values (that module says why each spelling is what it is). The texts are written
//! as the contents of JSON string literals, as they sit in a record (`"after":"{\"_id\": …}"`).
//!
//! What is not written here goes to the Python path, as in the default format: regular
//! expressions, code, DBRefs, legacy binary subtypes, special decimals, repeated names.

use base64::Engine as _;

use crate::rules::FieldRules;
use crate::walk::{string_text, DocumentWriter};
use crate::{
    decimal128_text, element_end, le_i32, le_i64, members, optional_members, removed_fields, truncated_arrays,
    envelope_parts, EnvelopeFormat, Parts, PartsFormat, Shortest, Unsupported, Written, BASE64, HEX,
};

/// A JSON string's delimiter inside the enclosing literal.
const QUOTE: &[u8] = b"\\\"";
/// The last millisecond `JsonWriter`'s relaxed mode writes as an ISO-8601 date (9999-12-31T23:59:59.999Z).
const LAST_ISO_MILLIS: i64 = 253_402_300_799_999;
/// The size of the bitmap of printable BMP code points.
const PRINTABLE_BYTES: usize = 0x10000 / 8;

/// One `JsonWriterSettings` of the driver, as Debezium uses them. Non-finite doubles are always
/// the relaxed `{"$numberDouble": …}`, which keeps the texts valid JSON (see `javajson._VALUE`).
#[derive(Clone, Copy)]
struct Settings {
    relaxed: bool,
    /// Between members and array elements: `,` when indenting (with empty indent and newline), else `, `.
    sep: &'static [u8],
}

/// `before`/`after`: Debezium's `COMPACT_JSON_SETTINGS` (strict, indented).
const STRICT_INDENTED: Settings = Settings { relaxed: false, sep: b"," };
/// The key's `_id`: `SIMPLE_JSON_SETTINGS` (relaxed, indented).
const RELAXED_INDENTED: Settings = Settings { relaxed: true, sep: b"," };
/// `updatedFields`: `BsonDocument.toJson()` (relaxed, not indented).
const RELAXED: Settings = Settings { relaxed: true, sep: b", " };

/// The Debezium 3.x format of the parts; `printable` is a bit per BMP code point (bit `c & 7` of
/// byte `c >> 3`), set where the driver writes the character as it is.
/// With `rules`, the collection's field rules apply to whole documents (an update is the Python
/// path's then).
pub(crate) struct Debezium3<'a> {
    printable: &'a [u8],
    rules: Option<&'a FieldRules>,
}

impl<'a> Debezium3<'a> {
    pub(crate) fn new(printable: &'a [u8], rules: Option<&'a FieldRules>) -> Result<Self, String> {
        if printable.len() != PRINTABLE_BYTES {
            return Err(format!("the printable bitmap holds {} bytes, not {PRINTABLE_BYTES}", printable.len()));
        }
        Ok(Debezium3 { printable, rules })
    }

    fn writer(&self, settings: Settings, out: Vec<u8>) -> JavaWriter<'a> {
        JavaWriter { out, settings, printable: self.printable }
    }
}

impl PartsFormat for Debezium3<'_> {
    fn key_id(&self, out: &mut Vec<u8>, document: &[u8]) -> Written {
        let (kind, value) = id_member(document).ok_or(Unsupported)?;
        let mut key = self.writer(RELAXED_INDENTED, std::mem::take(out));
        key.out.push(b'"');
        let written = key.value(kind, value, 0);
        key.out.push(b'"');
        *out = key.out;
        written
    }

    fn document(&self, out: &mut Vec<u8>, document: &[u8]) -> Written {
        let mut writer = self.writer(STRICT_INDENTED, std::mem::take(out));
        writer.out.push(b'"');
        let written = match self.rules {
            None => writer.document(document, false, 0),
            Some(rules) => rules.document(&mut writer, document),
        };
        writer.out.push(b'"');
        *out = writer.out;
        written
    }

    fn change_parts(&self, raw: &[u8], op: &str, pre_image: bool, update_full: bool) -> Result<Parts, Unsupported> {
        envelope_parts(self, raw, op, pre_image, update_full)
    }
}

impl EnvelopeFormat for Debezium3<'_> {
    /// `debezium3.update_description`: `updatedFields` always (`"{}"` when absent or empty), the
    /// lists null when empty.
    fn update_description(&self, desc: &[u8]) -> Result<Vec<u8>, Unsupported> {
        let (mut updated, mut removed, mut truncated) = (None, None, None);
        for (name, kind, value) in members(desc).ok_or(Unsupported)? {
            match (name, kind) {
                (b"updatedFields", 0x03) => updated = Some(value),
                (b"removedFields", 0x04) => removed = Some(value),
                (b"truncatedArrays", 0x04) => truncated = Some(value),
                (b"updatedFields", 0x0a) => updated = None,
                (b"removedFields", 0x0a) => removed = None,
                (b"truncatedArrays", 0x0a) => truncated = None,
                (b"updatedFields" | b"removedFields" | b"truncatedArrays", _) => return Err(Unsupported),
                _ => {}
            }
        }
        let mut out = self.writer(RELAXED, Vec::with_capacity(desc.len() * 2));
        out.out.extend_from_slice(b"{\"removedFields\":");
        removed_fields(&mut out.out, optional_members(removed)?, self.rules)?;
        out.out.extend_from_slice(b",\"updatedFields\":\"");
        match (updated, self.rules) {
            (Some(fields), None) => out.document(fields, false, 0)?,
            (Some(fields), Some(rules)) => {
                rules.updated_fields(&mut out, fields)?;
            }
            (None, _) => out.out.extend_from_slice(b"{}"),
        }
        out.out.extend_from_slice(b"\",\"truncatedArrays\":");
        truncated_arrays(&mut out.out, optional_members(truncated)?, self.rules)?;
        out.out.push(b'}');
        Ok(out.out)
    }
}

/// The type and value bytes of a document's first `_id` (a repeated one fails the document's own walk).
fn id_member(document: &[u8]) -> Option<(u8, &[u8])> {
    if document.len() < 5 {
        return None;
    }
    let end = document.len() - 1;
    let mut at = 4;
    while at < end {
        let kind = document[at];
        let name_end = at + 1 + document[at + 1..end].iter().position(|&b| b == 0)?;
        let found = &document[at + 1..name_end] == b"_id";
        at = name_end + 1;
        let next = element_end(kind, document, at, end)?;
        if found {
            return Some((kind, &document[at..next]));
        }
        at = next;
    }
    None
}

impl DocumentWriter for JavaWriter<'_> {
    fn out(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    fn separator(&self, _array: bool) -> &'static [u8] {
        self.settings.sep
    }

    fn name(&mut self, name: &[u8]) -> Written {
        self.string(name)?;
        self.out.extend_from_slice(b": ");
        Ok(())
    }

    fn scalar(&mut self, kind: u8, value: &[u8]) -> Written {
        JavaWriter::scalar(self, kind, value)
    }
}

/// Writes BSON values in one setting, as the contents of a JSON string literal.
struct JavaWriter<'a> {
    out: Vec<u8>,
    settings: Settings,
    printable: &'a [u8],
}

impl JavaWriter<'_> {
    fn integer(&mut self, value: i64) {
        self.out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }

    /// `\uXXXX` (lowercase hex) of one UTF-16 unit.
    fn unit(&mut self, code: u32) {
        self.out.extend_from_slice(b"\\\\u");
        for shift in [12, 8, 4, 0] {
            self.out.push(HEX[((code >> shift) & 15) as usize]);
        }
    }

    /// A string as `StrictCharacterStreamJsonWriter.writeStringHelper` writes it: the short escapes,
    /// printable characters as they are, every other UTF-16 unit (so both halves of a character
    /// beyond the BMP) as `\uXXXX`.
    fn string(&mut self, text: &[u8]) -> Written {
        let text = std::str::from_utf8(text).map_err(|_| Unsupported)?;
        let bytes = text.as_bytes();
        self.out.extend_from_slice(QUOTE);
        let (mut plain, mut i) = (0, 0);
        while i < bytes.len() {
            let byte = bytes[i];
            if byte < 0x80 {
                let escaped: &[u8] = match byte {
                    b'"' => b"\\\\\\\"",
                    b'\\' => b"\\\\\\\\",
                    0x08 => b"\\\\b",
                    0x09 => b"\\\\t",
                    0x0a => b"\\\\n",
                    0x0c => b"\\\\f",
                    0x0d => b"\\\\r",
                    0x20..=0x7e => {
                        i += 1;
                        continue;
                    }
                    _ => b"",
                };
                self.out.extend_from_slice(&bytes[plain..i]);
                if escaped.is_empty() {
                    self.unit(byte as u32);
                } else {
                    self.out.extend_from_slice(escaped);
                }
                i += 1;
                plain = i;
                continue;
            }
            // `i` is a character boundary: the loop steps over whole characters
            let ch = text[i..].chars().next().ok_or(Unsupported)?;
            let code = ch as u32;
            let width = ch.len_utf8();
            if code <= 0xFFFF && self.printable[(code >> 3) as usize] & (1 << (code & 7)) != 0 {
                i += width;
                continue;
            }
            self.out.extend_from_slice(&bytes[plain..i]);
            if code > 0xFFFF {
                let offset = code - 0x10000;
                self.unit(0xD800 + (offset >> 10));
                self.unit(0xDC00 + (offset & 0x3FF));
            } else {
                self.unit(code);
            }
            i += width;
            plain = i;
        }
        self.out.extend_from_slice(&bytes[plain..]);
        self.out.extend_from_slice(QUOTE);
        Ok(())
    }

    /// `Double.toString`: positional from 1e-3 up to below 1e7, otherwise `d.dddE±n`, with the
    /// shortest round-trip digits; non-finite values as `{"$numberDouble": "NaN"}`.
    fn double(&mut self, value: f64) -> Written {
        if !value.is_finite() {
            let text: &[u8] = if value.is_nan() {
                b"NaN"
            } else if value > 0.0 {
                b"Infinity"
            } else {
                b"-Infinity"
            };
            self.out.extend_from_slice(b"{\\\"$numberDouble\\\": \\\"");
            self.out.extend_from_slice(text);
            self.out.extend_from_slice(b"\\\"}");
            return Ok(());
        }
        let shortest = Shortest::of(value)?;
        if shortest.negative {
            self.out.push(b'-');
        }
        let digits = shortest.digits();
        if digits.is_empty() {
            self.out.extend_from_slice(b"0.0");
        } else if (-3..7).contains(&shortest.exponent) {
            shortest.positional(&mut self.out);
        } else {
            self.out.push(digits[0]);
            self.out.push(b'.');
            self.out.extend_from_slice(if digits.len() > 1 { &digits[1..] } else { b"0" });
            self.out.push(b'E');
            self.out.extend_from_slice(itoa::Buffer::new().format(shortest.exponent).as_bytes());
        }
        Ok(())
    }

    /// `{"$date": <millis>}` (strict); relaxed, an ISO-8601 instant from 1970 to 9999, else
    /// `{"$date": {"$numberLong": "<millis>"}}`.
    fn date(&mut self, millis: i64) {
        self.out.extend_from_slice(b"{\\\"$date\\\": ");
        if !self.settings.relaxed {
            self.integer(millis);
        } else if (0..=LAST_ISO_MILLIS).contains(&millis) {
            self.out.extend_from_slice(QUOTE);
            iso_millis(&mut self.out, millis);
            self.out.extend_from_slice(QUOTE);
        } else {
            self.out.extend_from_slice(b"{\\\"$numberLong\\\": \\\"");
            self.integer(millis);
            self.out.extend_from_slice(b"\\\"}");
        }
        self.out.push(b'}');
    }

    /// Strict `{"$binary": "<base64>", "$type": "<HEX>"}`, relaxed `{"$binary": {"base64": …, "subType": …}}`;
    /// subtypes 2 (an old form with its own length) and 3 (legacy UUIDs) go to Python.
    fn binary(&mut self, subtype: u8, data: &[u8]) -> Written {
        if subtype == 2 || subtype == 3 {
            return Err(Unsupported);
        }
        self.out.extend_from_slice(if self.settings.relaxed {
            b"{\\\"$binary\\\": {\\\"base64\\\": \\\""
        } else {
            b"{\\\"$binary\\\": \\\""
        });
        let start = self.out.len();
        self.out.resize(start + base64::encoded_len(data.len(), true).ok_or(Unsupported)?, 0);
        let written = BASE64.encode_slice(data, &mut self.out[start..]).map_err(|_| Unsupported)?;
        self.out.truncate(start + written);
        self.out.extend_from_slice(QUOTE);
        self.out.extend_from_slice(self.settings.sep);
        self.out.extend_from_slice(if self.settings.relaxed { b"\\\"subType\\\": \\\"" } else { b"\\\"$type\\\": \\\"" });
        const UPPER: &[u8; 16] = b"0123456789ABCDEF";
        self.out.push(UPPER[(subtype >> 4) as usize]);
        self.out.push(UPPER[(subtype & 15) as usize]);
        self.out.extend_from_slice(if self.settings.relaxed { b"\\\"}}" } else { b"\\\"}" });
        Ok(())
    }

    /// One value of type `kind` other than a document or an array (`value` its bytes, as `element_end` cuts them).
    fn scalar(&mut self, kind: u8, value: &[u8]) -> Written {
        match kind {
            0x01 => self.double(f64::from_bits(le_i64(value, 0).ok_or(Unsupported)? as u64))?,
            0x02 => self.string(string_text(value).ok_or(Unsupported)?)?,
            0x05 => self.binary(*value.get(4).ok_or(Unsupported)?, &value[5..])?,
            0x07 => {
                self.out.extend_from_slice(b"{\\\"$oid\\\": \\\"");
                for &byte in value {
                    self.out.push(HEX[(byte >> 4) as usize]);
                    self.out.push(HEX[(byte & 15) as usize]);
                }
                self.out.extend_from_slice(b"\\\"}");
            }
            0x08 => match value {
                [0] => self.out.extend_from_slice(b"false"),
                [1] => self.out.extend_from_slice(b"true"),
                _ => return Err(Unsupported),
            },
            0x09 => self.date(le_i64(value, 0).ok_or(Unsupported)?),
            0x0a => self.out.extend_from_slice(b"null"),
            0x10 => self.integer(le_i32(value, 0).ok_or(Unsupported)? as i64),
            0x11 => {
                let (inc, time) = (le_i32(value, 0).ok_or(Unsupported)? as u32, le_i32(value, 4).ok_or(Unsupported)? as u32);
                self.out.extend_from_slice(b"{\\\"$timestamp\\\": {\\\"t\\\": ");
                self.integer(time as i64);
                self.out.extend_from_slice(self.settings.sep);
                self.out.extend_from_slice(b"\\\"i\\\": ");
                self.integer(inc as i64);
                self.out.extend_from_slice(b"}}");
            }
            0x12 => {
                let number = le_i64(value, 0).ok_or(Unsupported)?;
                if self.settings.relaxed {
                    self.integer(number);
                } else {
                    self.out.extend_from_slice(b"{\\\"$numberLong\\\": \\\"");
                    self.integer(number);
                    self.out.extend_from_slice(b"\\\"}");
                }
            }
            0x13 => {
                self.out.extend_from_slice(b"{\\\"$numberDecimal\\\": \\\"");
                decimal128_text(&mut self.out, value)?;
                self.out.extend_from_slice(b"\\\"}");
            }
            0xff => self.out.extend_from_slice(b"{\\\"$minKey\\\": 1}"),
            0x7f => self.out.extend_from_slice(b"{\\\"$maxKey\\\": 1}"),
            _ => return Err(Unsupported),
        }
        Ok(())
    }
}

/// `ISO_OFFSET_DATE_TIME` of an instant in UTC (`javajson.iso_millis`): seconds always, the
/// fraction without trailing zeros; `millis` is within 1970..9999.
fn iso_millis(out: &mut Vec<u8>, millis: i64) {
    let (days, in_day) = (millis.div_euclid(86_400_000), millis.rem_euclid(86_400_000));
    // civil date of a day count (Howard Hinnant's `civil_from_days`)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let two = |out: &mut Vec<u8>, n: i64| {
        out.push(b'0' + (n / 10) as u8);
        out.push(b'0' + (n % 10) as u8);
    };
    out.extend_from_slice(itoa::Buffer::new().format(year).as_bytes());
    out.push(b'-');
    two(out, month);
    out.push(b'-');
    two(out, day);
    out.push(b'T');
    two(out, in_day / 3_600_000);
    out.push(b':');
    two(out, in_day / 60_000 % 60);
    out.push(b':');
    two(out, in_day / 1000 % 60);
    let ms = in_day % 1000;
    if ms != 0 {
        out.push(b'.');
        let digits = [b'0' + (ms / 100) as u8, b'0' + (ms / 10 % 10) as u8, b'0' + (ms % 10) as u8];
        let kept = digits.iter().rposition(|&d| d != b'0').map_or(0, |i| i + 1);
        out.extend_from_slice(&digits[..kept]);
    }
    out.push(b'Z');
}
