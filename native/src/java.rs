//! The parts of a change event in `mongocdc.event.format=debezium_3x`: BSON as the MongoDB Java
//! driver's `JsonWriter` writes it, byte for byte what `mongocdc_core.events.javajson` writes of
//! the decoded values (that module says why each spelling is what it is). The texts are written
//! as the contents of JSON string literals, as they sit in a record (`"after":"{\"_id\": …}"`).
//!
//! What is not written here goes to the Python path, as in the default format: regular
//! expressions, code, DBRefs, legacy binary subtypes, special decimals, repeated names.

use base64::Engine as _;

use crate::rules::FieldRules;
use crate::walk::{self, DocumentWriter};
use crate::{
    decimal128_text, document_string, envelope_parts, push_int, update_description, write_into, EnvelopeFormat, Parts,
    PartsFormat, Shortest, Unsupported, Written, BASE64, HEX,
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
/// With `rules`, the collection's field rules apply to whole documents and to `updatedFields`' paths.
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
        write_into(out, |out| self.writer(RELAXED_INDENTED, out), |writer| walk::key_id(writer, document, |_| true))
    }

    fn document(&self, out: &mut Vec<u8>, document: &[u8]) -> Written {
        write_into(out, |out| self.writer(STRICT_INDENTED, out), |writer| document_string(writer, document, self.rules))
    }

    fn change_parts(&self, raw: &[u8], op: &str, pre_image: bool, update_full: bool) -> Result<Parts, Unsupported> {
        envelope_parts(self, raw, op, pre_image, update_full)
    }
}

impl EnvelopeFormat for Debezium3<'_> {
    /// `debezium3.update_description`: `updatedFields` always (`"{}"` when absent or empty), the
    /// lists null when empty.
    fn update_description(&self, desc: &[u8]) -> Result<Vec<u8>, Unsupported> {
        update_description(self.writer(RELAXED, Vec::with_capacity(desc.len() * 2)), desc, self.rules, false)
    }
}

/// Writes BSON values in one setting, as the contents of a JSON string literal.
struct JavaWriter<'a> {
    out: Vec<u8>,
    settings: Settings,
    printable: &'a [u8],
}

impl JavaWriter<'_> {
    /// `\uXXXX` (lowercase hex) of one UTF-16 unit.
    fn unit(&mut self, code: u32) {
        self.out.extend_from_slice(b"\\\\u");
        for shift in [12, 8, 4, 0] {
            self.out.push(HEX[((code >> shift) & 15) as usize]);
        }
    }
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
            push_int(&mut self.out, millis);
        } else if (0..=LAST_ISO_MILLIS).contains(&millis) {
            self.out.extend_from_slice(QUOTE);
            iso_millis(&mut self.out, millis);
            self.out.extend_from_slice(QUOTE);
        } else {
            self.out.extend_from_slice(b"{\\\"$numberLong\\\": \\\"");
            push_int(&mut self.out, millis);
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

    fn object_id(&mut self, id: &[u8]) {
        self.out.extend_from_slice(b"{\\\"$oid\\\": \\\"");
        for &byte in id {
            self.out.push(HEX[(byte >> 4) as usize]);
            self.out.push(HEX[(byte & 15) as usize]);
        }
        self.out.extend_from_slice(b"\\\"}");
    }

    /// Relaxed, a number; strict, `{"$numberLong": "<n>"}`.
    fn int64(&mut self, value: i64) {
        if self.settings.relaxed {
            push_int(&mut self.out, value);
        } else {
            self.out.extend_from_slice(b"{\\\"$numberLong\\\": \\\"");
            push_int(&mut self.out, value);
            self.out.extend_from_slice(b"\\\"}");
        }
    }

    fn decimal128(&mut self, bid: &[u8]) -> Written {
        self.out.extend_from_slice(b"{\\\"$numberDecimal\\\": \\\"");
        decimal128_text(&mut self.out, bid)?;
        self.out.extend_from_slice(b"\\\"}");
        Ok(())
    }

    fn timestamp(&mut self, time: u32, increment: u32) -> Written {
        self.out.extend_from_slice(b"{\\\"$timestamp\\\": {\\\"t\\\": ");
        push_int(&mut self.out, i64::from(time));
        self.out.extend_from_slice(self.settings.sep);
        self.out.extend_from_slice(b"\\\"i\\\": ");
        push_int(&mut self.out, i64::from(increment));
        self.out.extend_from_slice(b"}}");
        Ok(())
    }

    fn key_bound(&mut self, max: bool) -> Written {
        self.out.extend_from_slice(if max { b"{\\\"$maxKey\\\": 1}" } else { b"{\\\"$minKey\\\": 1}" });
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
