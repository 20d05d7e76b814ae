//! Snapshot reads and change events from raw BSON to Debezium record bytes, without a Python
//! object per field.
//!
//! A snapshot spends its time turning each document into the `after` string of its record. The
//! Python path decodes the BSON into dicts, writes them with orjson and restyles the text; here the
//! BSON of a whole server batch is walked once and the record bytes are written directly, in the
//! exact spelling of `mongocdc_core.events.ejson.dumps_string` (strict Extended JSON, document
//! style, as a JSON string literal). Only the common types are written here; a document holding
//! anything else (regular expressions, timestamps, code, legacy UUIDs, special decimals, non-finite
//! doubles, duplicate names, DBRefs, ...) is reported back as `None` and converted by the Python
//! path, so the two always agree. Change events are written the same way, in the default format
//! (`DefaultFormat`) or in Debezium 3.x's (`java`), each a `PartsFormat` of the same event parts.
//! Every format's documents are walked by one walk (`walk`), generic over the writer's spelling.

mod java;
mod landing;
mod rules;
mod walk;

use base64::Engine as _;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use std::borrow::Cow;

use walk::{first_member, string_text, DocumentWriter, Elements, Unruled};

/// The document needs the Python path (a type or form not written here).
struct Unsupported;

type Written = Result<(), Unsupported>;

/// Documents nested deeper than this go to the Python path (which applies its own limits).
const MAX_DEPTH: u32 = 100;
/// Up to this many members, repeated names are found by a scan; beyond, by sorting them.
const LINEAR_NAMES: usize = 16;

fn le_i32(data: &[u8], at: usize) -> Option<i32> {
    data.get(at..at + 4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn le_i64(data: &[u8], at: usize) -> Option<i64> {
    data.get(at..at + 8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// Start offsets of the BSON documents laid end to end in `data`, then its length.
fn bounds_of(data: &[u8]) -> Result<Vec<usize>, String> {
    let mut bounds = Vec::with_capacity(data.len() / 64 + 2);
    let mut at = 0usize;
    while at < data.len() {
        let size = le_i32(data, at).ok_or_else(|| format!("truncated BSON document at byte {at}"))?;
        if size < 5 {
            return Err(format!("BSON document at byte {at} declares {size} bytes"));
        }
        let end = at + size as usize;
        if end > data.len() || data[end - 1] != 0 {
            return Err(format!("BSON document at byte {at} declares {size} bytes; {} remain", data.len() - at));
        }
        bounds.push(at);
        at = end;
    }
    bounds.push(data.len());
    Ok(bounds)
}

const HEX: &[u8; 16] = b"0123456789abcdef";
const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
/// Decimal128 (BID) high-word masks: infinity/NaN, and the "11" combination field of other forms.
const DECIMAL_SPECIAL: u64 = 0x7800_0000_0000_0000;
const DECIMAL_LARGE_FORM: u64 = 0x6000_0000_0000_0000;
const DECIMAL_MAX_COEFFICIENT: u128 = 10u128.pow(34) - 1;

/// A JSON string as orjson writes it. With `NESTED`, escaped once more as the contents of an
/// enclosing JSON string literal (Extended JSON text inside a record's `after`); without, plain JSON
/// text (such as `removedFields`). A constant, so each form compiles to its own loop: a flag read at
/// run time cost snapshot reads 18% of their conversion time.
fn json_string<const NESTED: bool>(out: &mut Vec<u8>, text: &[u8]) -> Written {
    let nested = NESTED;
    if std::str::from_utf8(text).is_err() {
        return Err(Unsupported);
    }
    out.extend_from_slice(if nested { b"\\\"" } else { b"\"" });
    let mut plain = 0;
    for (i, &byte) in text.iter().enumerate() {
        let escaped: &[u8] = match (byte, nested) {
            (b'"', true) => b"\\\\\\\"",
            (b'\\', true) => b"\\\\\\\\",
            (0x08, true) => b"\\\\b",
            (0x09, true) => b"\\\\t",
            (0x0a, true) => b"\\\\n",
            (0x0c, true) => b"\\\\f",
            (0x0d, true) => b"\\\\r",
            (b'"', false) => b"\\\"",
            (b'\\', false) => b"\\\\",
            (0x08, false) => b"\\b",
            (0x09, false) => b"\\t",
            (0x0a, false) => b"\\n",
            (0x0c, false) => b"\\f",
            (0x0d, false) => b"\\r",
            (0x00..=0x1f, _) => b"",
            _ => continue,
        };
        out.extend_from_slice(&text[plain..i]);
        plain = i + 1;
        if escaped.is_empty() {
            out.extend_from_slice(if nested { b"\\\\u00" } else { b"\\u00" });
            out.push(HEX[(byte >> 4) as usize]);
            out.push(HEX[(byte & 15) as usize]);
        } else {
            out.extend_from_slice(escaped);
        }
    }
    out.extend_from_slice(&text[plain..]);
    out.extend_from_slice(if nested { b"\\\"" } else { b"\"" });
    Ok(())
}

/// A finite double's shortest round-trip decimal digits: value = (-)d.ddd × 10^exponent.
struct Shortest {
    negative: bool,
    all: [u8; 32], // ryu writes at most 17 significant digits
    start: usize,
    end: usize,
    exponent: i32,
}

impl Shortest {
    /// Unsupported for NaN and the infinities (each writer spells those its own way).
    fn of(value: f64) -> Result<Self, Unsupported> {
        if !value.is_finite() {
            return Err(Unsupported);
        }
        let mut buffer = ryu::Buffer::new();
        let shortest = buffer.format_finite(value).as_bytes();
        let (negative, text) = match shortest.split_first() {
            Some((b'-', rest)) => (true, rest),
            _ => (false, shortest),
        };
        let (mantissa, exponent) = match text.iter().position(|&b| b == b'e') {
            Some(e) => {
                let exp = std::str::from_utf8(&text[e + 1..]).ok().and_then(|s| s.parse::<i32>().ok());
                (&text[..e], exp.ok_or(Unsupported)?)
            }
            None => (text, 0),
        };
        let dot = mantissa.iter().position(|&b| b == b'.').unwrap_or(mantissa.len()) as i32;
        let mut all = [0u8; 32];
        let mut count = 0;
        for &b in mantissa.iter().filter(|&&b| b != b'.') {
            *all.get_mut(count).ok_or(Unsupported)? = b;
            count += 1;
        }
        let leading = all[..count].iter().take_while(|&&b| b == b'0').count();
        let end = all[..count].iter().rposition(|&b| b != b'0').map_or(leading, |i| i + 1);
        // value = 0.<all> * 10^(dot + exponent) = d.ddd * 10^e
        Ok(Shortest { negative, all, start: leading, end: end.max(leading), exponent: dot + exponent - 1 - leading as i32 })
    }

    /// The significant digits (none for zero).
    fn digits(&self) -> &[u8] {
        &self.all[self.start..self.end]
    }

    /// The digits without an exponent, with at least one digit either side of the point
    /// (`100.0`, `0.00125`): how orjson and Java's `Double.toString` both write mid-range values.
    fn positional(&self, out: &mut Vec<u8>) {
        let (digits, e) = (self.digits(), self.exponent);
        if e >= 0 {
            let whole = (e + 1) as usize;
            if digits.len() <= whole {
                out.extend_from_slice(digits);
                out.extend(std::iter::repeat_n(b'0', whole - digits.len()));
                out.extend_from_slice(b".0");
            } else {
                out.extend_from_slice(&digits[..whole]);
                out.push(b'.');
                out.extend_from_slice(&digits[whole..]);
            }
        } else {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', (-e - 1) as usize));
            out.extend_from_slice(digits);
        }
    }
}

/// A Decimal128's text as Python's `decimal.Decimal` prints the value (`str(Decimal128)`, as
/// `ejson.decimal128_text` computes it); infinities, NaN and non-canonical encodings go to Python.
fn decimal128_text(out: &mut Vec<u8>, bid: &[u8]) -> Written {
    let n = u128::from_le_bytes(bid.try_into().map_err(|_| Unsupported)?);
    let high = (n >> 64) as u64;
    if high & DECIMAL_SPECIAL == DECIMAL_SPECIAL || high & DECIMAL_LARGE_FORM == DECIMAL_LARGE_FORM {
        return Err(Unsupported);
    }
    let coefficient = n & ((1u128 << 113) - 1);
    if coefficient > DECIMAL_MAX_COEFFICIENT {
        return Err(Unsupported);
    }
    let exponent = ((high & 0x7FFF_8000_0000_0000) >> 49) as i64 - 6176;
    if high >> 63 == 1 {
        out.push(b'-');
    }
    let digits = coefficient.to_string();
    let digits = digits.as_bytes();
    let count = digits.len() as i64;
    let adjusted = exponent + count - 1;
    if exponent <= 0 && adjusted >= -6 {
        if exponent == 0 {
            out.extend_from_slice(digits);
        } else if count > -exponent {
            let point = (count + exponent) as usize;
            out.extend_from_slice(&digits[..point]);
            out.push(b'.');
            out.extend_from_slice(&digits[point..]);
        } else {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', (-exponent - count) as usize));
            out.extend_from_slice(digits);
        }
    } else {
        out.push(digits[0]);
        if count > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'E');
        out.push(if adjusted < 0 { b'-' } else { b'+' });
        out.extend_from_slice(itoa::Buffer::new().format(adjusted.unsigned_abs()).as_bytes());
    }
    Ok(())
}

/// The separators of one textual style of `mongocdc_core.events.ejson` (its `JsonStyle`), and the
/// openings of the Extended JSON wrappers spelled with them, as the contents of a JSON string
/// literal. Constants, so that each style compiles to its own writer (no flag read per value).
trait Style {
    /// After a member's name.
    const NAME: &'static [u8];
    /// Between array elements (members are always separated by `,`).
    const ARRAY: &'static [u8];
    const OID: &'static [u8];
    const DATE: &'static [u8];
    const LONG: &'static [u8];
    const DECIMAL: &'static [u8];
    const BINARY: &'static [u8];
    /// Between a binary's base64 and its subtype.
    const BINARY_TYPE: &'static [u8];
}

/// `DOCUMENT_STYLE`: the default format's `before`, `after` and `updatedFields`.
struct DocumentStyle;
/// `LEGACY_STYLE`: the 1.x format's `after` and `filter`.
struct LegacyStyle;
/// `COMPACT_STYLE`: the 1.x format's `patch`.
struct CompactStyle;

impl Style for DocumentStyle {
    const NAME: &'static [u8] = b": ";
    const ARRAY: &'static [u8] = b", ";
    const OID: &'static [u8] = b"{\\\"$oid\\\": \\\"";
    const DATE: &'static [u8] = b"{\\\"$date\\\": ";
    const LONG: &'static [u8] = b"{\\\"$numberLong\\\": \\\"";
    const DECIMAL: &'static [u8] = b"{\\\"$numberDecimal\\\": \\\"";
    const BINARY: &'static [u8] = b"{\\\"$binary\\\": \\\"";
    const BINARY_TYPE: &'static [u8] = b"\\\",\\\"$type\\\": \\\"";
}

impl Style for LegacyStyle {
    const NAME: &'static [u8] = b" : ";
    const ARRAY: &'static [u8] = b", ";
    const OID: &'static [u8] = b"{\\\"$oid\\\" : \\\"";
    const DATE: &'static [u8] = b"{\\\"$date\\\" : ";
    const LONG: &'static [u8] = b"{\\\"$numberLong\\\" : \\\"";
    const DECIMAL: &'static [u8] = b"{\\\"$numberDecimal\\\" : \\\"";
    const BINARY: &'static [u8] = b"{\\\"$binary\\\" : \\\"";
    const BINARY_TYPE: &'static [u8] = b"\\\",\\\"$type\\\" : \\\"";
}

impl Style for CompactStyle {
    const NAME: &'static [u8] = b":";
    const ARRAY: &'static [u8] = b",";
    const OID: &'static [u8] = b"{\\\"$oid\\\":\\\"";
    const DATE: &'static [u8] = b"{\\\"$date\\\":";
    const LONG: &'static [u8] = b"{\\\"$numberLong\\\":\\\"";
    const DECIMAL: &'static [u8] = b"{\\\"$numberDecimal\\\":\\\"";
    const BINARY: &'static [u8] = b"{\\\"$binary\\\":\\\"";
    const BINARY_TYPE: &'static [u8] = b"\\\",\\\"$type\\\":\\\"";
}

/// Writes Extended JSON text in style `S`, already escaped as the contents of a JSON string literal.
struct Writer<S: Style = DocumentStyle> {
    out: Vec<u8>,
    style: std::marker::PhantomData<S>,
}

impl<S: Style> Writer<S> {
    fn new(out: Vec<u8>) -> Self {
        Writer { out, style: std::marker::PhantomData }
    }
}

impl<S: Style> DocumentWriter for Writer<S> {
    fn out(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    fn separator(&self, array: bool) -> &'static [u8] {
        if array {
            S::ARRAY
        } else {
            b","
        }
    }

    fn name(&mut self, name: &[u8]) -> Written {
        self.string(name)?;
        self.out.extend_from_slice(S::NAME);
        Ok(())
    }

    /// A string value or member name: orjson's escapes, then those of the enclosing literal.
    #[inline]
    fn string(&mut self, text: &[u8]) -> Written {
        json_string::<true>(&mut self.out, text)
    }

    /// A finite double as orjson writes it: the shortest round-trip digits, positional from 1e-5
    /// up to below 1e16 (with `.0` when integral), otherwise `d.ddde+NN` / `d.ddde-N`.
    fn double(&mut self, value: f64) -> Written {
        let shortest = Shortest::of(value)?;
        let (digits, e) = (shortest.digits(), shortest.exponent);
        if shortest.negative {
            self.out.push(b'-');
        }
        if digits.is_empty() {
            self.out.extend_from_slice(b"0.0");
            return Ok(());
        }
        if (-5..16).contains(&e) {
            shortest.positional(&mut self.out);
        } else {
            self.out.push(digits[0]);
            if digits.len() > 1 {
                self.out.push(b'.');
                self.out.extend_from_slice(&digits[1..]);
            }
            self.out.extend_from_slice(if e > 0 { b"e+" } else { b"e-" });
            self.out.extend_from_slice(itoa::Buffer::new().format(e.unsigned_abs()).as_bytes());
        }
        Ok(())
    }

    /// `{"$binary": <base64>, "$type": <hex>}` as json_util writes it; subtypes 2 (an old form with
    /// its own length) and 3 (legacy UUIDs, spelled after the client's UUID representation) go to
    /// Python.
    fn binary(&mut self, subtype: u8, data: &[u8]) -> Written {
        if subtype == 2 || subtype == 3 {
            return Err(Unsupported);
        }
        self.out.extend_from_slice(S::BINARY);
        let start = self.out.len();
        self.out.resize(start + base64::encoded_len(data.len(), true).ok_or(Unsupported)?, 0);
        let written = BASE64.encode_slice(data, &mut self.out[start..]).map_err(|_| Unsupported)?;
        self.out.truncate(start + written);
        self.out.extend_from_slice(S::BINARY_TYPE);
        self.out.push(HEX[(subtype >> 4) as usize]);
        self.out.push(HEX[(subtype & 15) as usize]);
        self.out.extend_from_slice(b"\\\"}");
        Ok(())
    }

    /// `{"$numberDecimal": <text>}` (see `decimal128_text`).
    fn decimal128(&mut self, bid: &[u8]) -> Written {
        self.out.extend_from_slice(S::DECIMAL);
        decimal128_text(&mut self.out, bid)?;
        self.out.extend_from_slice(b"\\\"}");
        Ok(())
    }

    fn object_id(&mut self, id: &[u8]) {
        self.out.extend_from_slice(S::OID);
        for &byte in id {
            self.out.push(HEX[(byte >> 4) as usize]);
            self.out.push(HEX[(byte & 15) as usize]);
        }
        self.out.extend_from_slice(b"\\\"}");
    }

    fn date(&mut self, millis: i64) {
        self.out.extend_from_slice(S::DATE);
        push_int(&mut self.out, millis);
        self.out.push(b'}');
    }

    fn int64(&mut self, value: i64) {
        self.out.extend_from_slice(S::LONG);
        push_int(&mut self.out, value);
        self.out.extend_from_slice(b"\\\"}");
    }

    /// Timestamps are the Python path's (json_util's spelling).
    fn timestamp(&mut self, _time: u32, _increment: u32) -> Written {
        Err(Unsupported)
    }

    /// MinKey and MaxKey are the Python path's (json_util's spelling).
    fn key_bound(&mut self, _max: bool) -> Written {
        Err(Unsupported)
    }
}

/// Whether a document repeats a member name (`names` is reordered).
fn repeats<T: Ord>(names: &mut [T]) -> bool {
    if names.len() <= LINEAR_NAMES {
        return names.iter().enumerate().any(|(i, name)| names[..i].contains(name));
    }
    names.sort_unstable();
    names.windows(2).any(|pair| pair[0] == pair[1])
}

/// Where the element of type `kind` whose value starts at `at` ends (None: a type of no fixed or
/// declared length here, or a length that leaves `..end`).
#[inline]
fn element_end(kind: u8, data: &[u8], at: usize, end: usize) -> Option<usize> {
    let declared = |minimum: usize| usize::try_from(le_i32(data, at)?).ok().filter(|&size| size >= minimum);
    let next = match kind {
        0x01 | 0x09 | 0x11 | 0x12 => at + 8,
        0x07 => at + 12,
        0x08 => at + 1,
        0x0a | 0x7f | 0xff => at,
        0x10 => at + 4,
        0x13 => at + 16,
        0x02 => at + 4 + declared(1)?,
        0x03 | 0x04 => at + declared(5)?,
        0x05 => at + 5 + declared(0)?,
        _ => return None,
    };
    (next <= end).then_some(next)
}

/// One read: the key and value bytes (templates around the key's id and the document's string).
fn read_record<F: PartsFormat>(
    format: &F,
    document: &[u8],
    templates: &[&[u8]; 4],
    key: &mut Vec<u8>,
    value: &mut Vec<u8>,
) -> Written {
    let [key_head, key_tail, value_head, value_tail] = *templates;
    key.extend_from_slice(key_head);
    format.key_id(key, document)?;
    key.extend_from_slice(key_tail);
    value.extend_from_slice(value_head);
    format.document(value, document)?;
    value.extend_from_slice(value_tail);
    Ok(())
}

/// A cursor's id, its batch's documents laid end to end with their bounds, and its `atClusterTime`.
type Batch = (i64, Vec<u8>, Vec<usize>, Option<(u32, u32)>);

/// The `cursor` of a `find`/`getMore` reply.
fn batch_of(reply: &[u8]) -> Result<Batch, String> {
    let cursor = member(reply, b"cursor", &[0x03]).ok_or("the reply has no 'cursor' document")?;
    let id = match member(cursor, b"id", &[0x12, 0x10]) {
        Some(value) if value.len() == 8 => le_i64(value, 0).unwrap_or(0),
        Some(value) => le_i32(value, 0).unwrap_or(0) as i64,
        None => return Err("the reply's cursor has no 'id'".to_string()),
    };
    let read_at = member(cursor, b"atClusterTime", &[0x11])
        .and_then(|value| Some((le_i32(value, 4)? as u32, le_i32(value, 0)? as u32)));
    let array = member(cursor, b"firstBatch", &[0x04])
        .or_else(|| member(cursor, b"nextBatch", &[0x04]))
        .ok_or("the reply's cursor has no 'firstBatch'/'nextBatch' array")?;
    let mut data = Vec::with_capacity(array.len());
    let mut bounds = Vec::new();
    let end = array.len() - 1;
    let mut at = 4;
    while at < end {
        if array[at] != 0x03 {
            return Err(format!("the batch holds an element of BSON type {:#04x}, not a document", array[at]));
        }
        let name = array[at + 1..end].iter().position(|&b| b == 0).ok_or("truncated batch")?;
        at += 2 + name;
        let size = le_i32(array, at).filter(|&n| n >= 5).ok_or("truncated batch")? as usize;
        if at + size > end {
            return Err("truncated batch".to_string());
        }
        bounds.push(data.len());
        data.extend_from_slice(&array[at..at + size]);
        at += size;
    }
    bounds.push(data.len());
    Ok((id, data, bounds, read_at))
}

/// The value of the top-level member `name` of a document, when it has one of the types `kinds`
/// (a nested document or array from its length to its NUL; a scalar as its bytes).
fn member<'a>(document: &'a [u8], name: &[u8], kinds: &[u8]) -> Option<&'a [u8]> {
    first_member(document, name).filter(|(kind, _)| kinds.contains(kind)).map(|(_, value)| value)
}

/// The cursor id of a raw `find`/`getMore` reply, its batch (the documents laid end to end, and
/// their bounds as `document_bounds` gives them) and the cursor's `atClusterTime` as (time, inc).
/// No Python object per document.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn cursor_batch<'py>(
    py: Python<'py>,
    reply: &[u8],
) -> PyResult<(i64, Bound<'py, PyBytes>, Vec<usize>, Option<(u32, u32)>)> {
    let (id, data, bounds, at) = batch_of(reply).map_err(PyValueError::new_err)?;
    Ok((id, PyBytes::new(py, &data), bounds, at))
}

/// Start offsets of the documents of a raw batch (as pymongo's `find_raw_batches` yields it), then
/// its length; a ValueError names the first byte that does not frame a document.
#[pyfunction]
fn document_bounds(data: &[u8]) -> PyResult<Vec<usize>> {
    bounds_of(data).map_err(PyValueError::new_err)
}

/// Offsets as native-endian u64 bytes (Python reads them through `memoryview.cast("Q")`).
fn ends_bytes(ends: &[u64]) -> Vec<u8> {
    ends.iter().flat_map(|end| end.to_ne_bytes()).collect()
}

/// The reads `lo..hi` of `data` (documents at `bounds`) as one run: their keys laid end to end and
/// the end offset of each, the same for their values (each key and value the templates around the
/// document's key id and `after` string), and the indexes (counted from `lo`) of the documents the
/// Python path converts, whose key and value are left empty. No Python object per document, and
/// the conversion runs without the GIL, so the copier's threads convert at the same time. With
/// `printable` (see `java`), the key id and `after` are Debezium 3.x's texts; with `legacy`, the
/// 1.x format's (`LegacyFormat`).
#[pyfunction]
#[pyo3(signature = (data, bounds, lo, hi, key_head, key_tail, value_head, value_tail, printable=None, rules=None, legacy=false, landing=false))]
#[allow(clippy::too_many_arguments)]
#[allow(clippy::type_complexity)]
fn convert_reads<'py>(
    py: Python<'py>,
    data: &[u8],
    bounds: Vec<usize>,
    lo: usize,
    hi: usize,
    key_head: &[u8],
    key_tail: &[u8],
    value_head: &[u8],
    value_tail: &[u8],
    printable: Option<&[u8]>,
    rules: Option<Bound<'py, rules::FieldRules>>,
    legacy: bool,
    landing: bool,
) -> PyResult<ReadsOut<'py>> {
    if lo > hi || hi >= bounds.len() || bounds[hi] > data.len() || bounds[lo..=hi].windows(2).any(|w| w[0] > w[1]) {
        return Err(PyValueError::new_err(format!(
            "reads {lo}..{hi} do not fit {} ascending bounds within {} bytes",
            bounds.len(),
            data.len()
        )));
    }
    if legacy && printable.is_some() {
        return Err(PyValueError::new_err("reads of the 1.x format take no printable bitmap"));
    }
    let templates = [key_head, key_tail, value_head, value_tail];
    let rules = rules.as_ref().map(|r| r.get());
    let debezium3 = printable.map(|p| java::Debezium3::new(p, rules)).transpose().map_err(PyValueError::new_err)?;
    let (keys, key_ends, values, value_ends, left, afters) = py.allow_threads(|| match &debezium3 {
        None if legacy => reads_run(&LegacyFormat { rules }, data, &bounds, lo, hi, &templates, landing),
        None => reads_run(&DefaultFormat { rules }, data, &bounds, lo, hi, &templates, landing),
        Some(format) => reads_run(format, data, &bounds, lo, hi, &templates, landing),
    });
    let afters = match afters {
        Some(afters) => afters.into_py(py)?,
        None => None,
    };
    Ok((PyBytes::new(py, &keys), PyBytes::new(py, &key_ends), PyBytes::new(py, &values), PyBytes::new(py, &value_ends), left, afters))
}

/// `convert_reads` for Python: keys, key ends, values, value ends, left reads and the `after` column.
type ReadsOut<'py> = (
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Vec<usize>,
    Option<(Bound<'py, landing::Buffer>, Bound<'py, landing::Buffer>)>,
);

/// The keys, key ends, values, value ends, left reads and (with `landing`) the `after` column of
/// `convert_reads`, in one format.
type Run = (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>, Vec<usize>, Option<landing::Afters>);

fn reads_run<F: PartsFormat>(
    format: &F,
    data: &[u8],
    bounds: &[usize],
    lo: usize,
    hi: usize,
    templates: &[&[u8]; 4],
    landing: bool,
) -> Run {
    let [key_head, key_tail, value_head, value_tail] = *templates;
    let mut afters = landing.then(|| landing::Afters::new(hi - lo, bounds[hi] - bounds[lo]));
    let mut key = Vec::with_capacity((hi - lo) * (key_head.len() + key_tail.len() + 48));
    let mut value = Vec::with_capacity(bounds[hi] - bounds[lo] + (hi - lo) * (value_head.len() + value_tail.len() + 64));
    let mut key_ends: Vec<u64> = Vec::with_capacity(hi - lo);
    let mut value_ends: Vec<u64> = Vec::with_capacity(hi - lo);
    let mut left: Vec<usize> = Vec::new();
    for i in lo..hi {
        let (key_mark, value_mark) = (key.len(), value.len());
        let written = read_record(format, &data[bounds[i]..bounds[i + 1]], templates, &mut key, &mut value).is_ok();
        if !written {
            key.truncate(key_mark);
            value.truncate(value_mark);
            left.push(i - lo);
        }
        if let Some(afters) = afters.as_mut() {
            let after = value_mark + value_head.len()..value.len() - value_tail.len();
            afters.push(written.then(|| &value[after]));
        }
        key_ends.push(key.len() as u64);
        value_ends.push(value.len() as u64);
    }
    (key, ends_bytes(&key_ends), value, ends_bytes(&value_ends), left, afters)
}

/// One member of a document: its name, BSON type and value bytes.
type Member<'a> = (&'a [u8], u8, &'a [u8]);

/// The top-level members of a document as (name, BSON type, value bytes), in order; None when the
/// document does not frame (or holds a type of no known length).
fn members(document: &[u8]) -> Option<Vec<Member<'_>>> {
    let mut found = Vec::with_capacity(12);
    for element in Elements::of(document)? {
        found.push(element.ok()?);
    }
    Some(found)
}

/// A BSON string value's text (without its length and NUL).
fn string_value(kind: u8, value: &[u8]) -> Option<&str> {
    if kind != 0x02 || value.len() < 5 {
        return None;
    }
    std::str::from_utf8(&value[4..value.len() - 1]).ok()
}

/// What the stream reader and the dispatcher need of an ordinary change event: (resume token
/// `_data`, operationType, ns.db, ns.coll, clusterTime seconds, clusterTime increment, txnNumber,
/// lsid as its BSON), the last two for an event of a transaction.
type Header<'a> = (&'a str, &'a str, &'a str, &'a str, u32, u32, Option<i64>, Option<&'a [u8]>);

fn header_of(raw: &[u8]) -> Option<Header<'_>> {
    if usize::try_from(le_i32(raw, 0)?).ok()? != raw.len() {
        return None; // a length that lies: pymongo's own checks say what is wrong
    }
    let (mut token, mut op, mut ns, mut time, mut txn, mut lsid) = (None, None, None, None, None, None);
    for (name, kind, value) in members(raw)? {
        match name {
            b"_id" if kind == 0x03 => match members(value)?.as_slice() {
                [(b"_data", 0x02, data)] => token = Some(string_value(0x02, data)?),
                _ => return None, // `_typeBits` and other token forms: decoded by Python
            },
            b"operationType" => op = Some(string_value(kind, value)?),
            b"ns" if kind == 0x03 => {
                let parts = members(value)?;
                // the last of a repeated name, as a decoded dict keeps it
                let part = |wanted: &[u8]| parts.iter().rev().find(|(n, _, _)| *n == wanted).and_then(|(_, k, v)| string_value(*k, v));
                ns = Some((part(b"db")?, part(b"coll")?));
            }
            b"clusterTime" if kind == 0x11 => time = Some((le_i32(value, 4)? as u32, le_i32(value, 0)? as u32)),
            b"txnNumber" if kind == 0x12 => txn = Some(le_i64(value, 0)?),
            b"txnNumber" if kind == 0x10 => txn = Some(le_i32(value, 0)? as i64),
            b"lsid" if kind == 0x03 => lsid = Some(value),
            // split fragments and unusual shapes take the decoded path
            b"_id" | b"ns" | b"clusterTime" | b"lsid" | b"txnNumber" | b"splitEvent" => return None,
            _ => {}
        }
    }
    if txn.is_some() != lsid.is_some() {
        return None; // half a transaction's fields: the Python path says what it makes of it
    }
    let ((db, coll), (seconds, increment)) = (ns?, time?);
    Some((token?, op?, db, coll, seconds, increment, txn, lsid))
}

/// What the stream reader and the dispatcher need of an ordinary change event, by name (see `Header`).
#[pyclass(frozen, get_all, module = "mongocdc_native")]
struct ChangeHeader {
    /// The resume token's `_data`.
    token: Py<PyString>,
    op_type: Py<PyString>,
    db: Py<PyString>,
    coll: Py<PyString>,
    /// clusterTime's seconds and increment.
    seconds: u32,
    increment: u32,
    /// A transaction's `txnNumber` and `lsid` (its BSON); None outside one.
    txn_number: Option<i64>,
    lsid: Option<Py<PyBytes>>,
}

#[pymethods]
impl ChangeHeader {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "ChangeHeader(token={:?}, op_type={:?}, db={:?}, coll={:?}, seconds={}, increment={}, txn_number={:?}, lsid={})",
            self.token.bind(py).to_string(), self.op_type.bind(py).to_string(), self.db.bind(py).to_string(),
            self.coll.bind(py).to_string(), self.seconds, self.increment, self.txn_number,
            if self.lsid.is_some() { "<bson>" } else { "None" },
        )
    }
}

/// The header of an ordinary change event (a `ChangeHeader`), or None for any other: a split
/// fragment, a token with `_typeBits`, no `ns.coll` or no `clusterTime`. Those are decoded and
/// handled by Python.
#[pyfunction]
fn change_header(py: Python<'_>, raw: &[u8]) -> PyResult<Option<Py<ChangeHeader>>> {
    let Some((token, op_type, db, coll, seconds, increment, txn_number, lsid)) = header_of(raw) else {
        return Ok(None);
    };
    let header = ChangeHeader {
        token: PyString::new(py, token).unbind(),
        op_type: PyString::new(py, op_type).unbind(),
        db: PyString::new(py, db).unbind(),
        coll: PyString::new(py, coll).unbind(),
        seconds,
        increment,
        txn_number,
        lsid: lsid.map(|bson| PyBytes::new(py, bson).unbind()),
    };
    Ok(Some(Py::new(py, header)?))
}

/// The members of an optional array or document (none when absent).
fn optional_members(value: Option<&[u8]>) -> Result<Vec<Member<'_>>, Unsupported> {
    value.map_or(Ok(Vec::new()), |v| members(v).ok_or(Unsupported))
}

/// The members of an `updateDescription` the formats write: `updatedFields`, `removedFields`,
/// `truncatedArrays`, each None when absent or null (the last of a repeated name, as a decoded dict keeps it).
type UpdateMembers<'a> = (Option<&'a [u8]>, Option<&'a [u8]>, Option<&'a [u8]>);

fn update_members(desc: &[u8]) -> Result<UpdateMembers<'_>, Unsupported> {
    let (mut updated, mut removed, mut truncated) = (None, None, None);
    for (name, kind, value) in members(desc).ok_or(Unsupported)? {
        let (slot, wanted) = match name {
            b"updatedFields" => (&mut updated, 0x03),
            b"removedFields" => (&mut removed, 0x04),
            b"truncatedArrays" => (&mut truncated, 0x04),
            _ => continue,
        };
        *slot = match kind {
            0x0a => None,
            _ if kind == wanted => Some(value),
            _ => return Err(Unsupported),
        };
    }
    Ok((updated, removed, truncated))
}

/// `updatedFields` as a document written by `writer`, with the collection's field rules; how many
/// members it kept.
fn updated_fields<W: DocumentWriter>(writer: &mut W, fields: &[u8], rules: Option<&rules::FieldRules>) -> Result<usize, Unsupported> {
    match rules {
        None => writer.ruled(fields, false, 0, Unruled),
        Some(rules) => rules.updated_fields(writer, fields),
    }
}

/// `updateDescription` as JSON, its `updatedFields` a JSON string of the text `writer` writes, with the
/// collection's field rules: as `envelope.update_description` writes it (`empty_null`: `updatedFields`
/// absent or left empty is `null`) or `debezium3.update_description` (`"{}"`).
fn update_description<W: DocumentWriter>(mut writer: W, desc: &[u8], rules: Option<&rules::FieldRules>, empty_null: bool) -> Result<Vec<u8>, Unsupported> {
    let (updated, removed, truncated) = update_members(desc)?;
    writer.out().extend_from_slice(b"{\"removedFields\":");
    removed_fields(writer.out(), optional_members(removed)?, rules)?;
    writer.out().extend_from_slice(b",\"updatedFields\":");
    let mark = writer.out().len();
    writer.out().push(b'"');
    let kept = match updated {
        Some(fields) => updated_fields(&mut writer, fields, rules)?,
        None => {
            writer.out().extend_from_slice(b"{}");
            0
        }
    };
    writer.out().push(b'"');
    if kept == 0 && empty_null {
        writer.out().truncate(mark);
        writer.out().extend_from_slice(b"null");
    }
    writer.out().extend_from_slice(b",\"truncatedArrays\":");
    truncated_arrays(writer.out(), optional_members(truncated)?, rules)?;
    writer.out().push(b'}');
    Ok(std::mem::take(writer.out()))
}

/// A whole document (`before`, `after`, a read) as a JSON string of the text `writer` writes, with the
/// collection's field rules.
fn document_string<W: DocumentWriter>(writer: &mut W, document: &[u8], rules: Option<&rules::FieldRules>) -> Written {
    writer.out().push(b'"');
    match rules {
        None => writer.document(document, false, 0)?,
        Some(rules) => rules.document(writer, document)?,
    }
    writer.out().push(b'"');
    Ok(())
}

/// `write` by the writer `make` makes of `out`'s bytes, which then hold what it wrote (also on Err).
fn write_into<W: DocumentWriter>(out: &mut Vec<u8>, make: impl FnOnce(Vec<u8>) -> W, write: impl FnOnce(&mut W) -> Written) -> Written {
    let mut writer = make(std::mem::take(out));
    let written = write(&mut writer);
    *out = std::mem::take(writer.out());
    written
}

/// A `removedFields` or `truncatedArrays` path under the collection's field rules (None: excluded).
fn ruled_path<'a>(text: &'a [u8], rules: Option<&rules::FieldRules>) -> Result<Option<Cow<'a, [u8]>>, Unsupported> {
    match rules {
        None => Ok(Some(Cow::Borrowed(text))),
        Some(rules) => Ok(rules.field_path(text)?.map(Cow::Owned)),
    }
}

/// `removedFields` as a JSON list of its paths under the rules, or `null` when none is left.
fn removed_fields(out: &mut Vec<u8>, removed: Vec<Member<'_>>, rules: Option<&rules::FieldRules>) -> Written {
    let mut count = 0;
    for (_, kind, value) in removed {
        let text = if kind == 0x02 { string_text(value).ok_or(Unsupported)? } else { return Err(Unsupported) };
        let Some(path) = ruled_path(text, rules)? else { continue };
        out.push(if count == 0 { b'[' } else { b',' });
        count += 1;
        json_string::<false>(out, &path)?;
    }
    out.extend_from_slice(if count == 0 { b"null" } else { b"]" });
    Ok(())
}

/// `truncatedArrays` as `[{"field": …, "size": …}]` (paths under the rules), or `null` when none is left.
fn truncated_arrays(out: &mut Vec<u8>, truncated: Vec<Member<'_>>, rules: Option<&rules::FieldRules>) -> Written {
    let mut count = 0;
    for (_, kind, entry) in truncated {
        let parts = if kind == 0x03 { members(entry).ok_or(Unsupported)? } else { return Err(Unsupported) };
        if repeats(&mut parts.iter().map(|(n, _, _)| *n).collect::<Vec<_>>()) {
            return Err(Unsupported); // decoded as a dict, the last value would win
        }
        let field = parts.iter().find(|(n, _, _)| *n == b"field").ok_or(Unsupported)?;
        let size = parts.iter().find(|(n, _, _)| *n == b"newSize").ok_or(Unsupported)?;
        let text = if field.1 == 0x02 { string_text(field.2).ok_or(Unsupported)? } else { return Err(Unsupported) };
        let size = match size.1 {
            0x10 => le_i32(size.2, 0).ok_or(Unsupported)? as i64,
            0x12 => le_i64(size.2, 0).ok_or(Unsupported)?,
            _ => return Err(Unsupported),
        };
        let Some(path) = ruled_path(text, rules)? else { continue };
        out.extend_from_slice(if count == 0 { b"[{\"field\":" } else { b",{\"field\":" });
        count += 1;
        json_string::<false>(out, &path)?;
        out.extend_from_slice(b",\"size\":");
        out.extend_from_slice(itoa::Buffer::new().format(size).as_bytes());
        out.push(b'}');
    }
    out.extend_from_slice(if count == 0 { b"null" } else { b"]" });
    Ok(())
}

/// The parts of one change event's record, written from its BSON in the record's format: the key's
/// `id` string, then `before`, `after` and `update` as their JSON (`update`: `updateDescription`, or
/// the 1.x format's `patch`), the 1.x format's `filter` (empty in the others), and `wallTime` in
/// milliseconds.
struct Parts {
    key_id: Vec<u8>,
    before: Vec<u8>,
    after: Vec<u8>,
    update: Vec<u8>,
    filter: Vec<u8>,
    wall_ms: Option<i64>,
}

/// How one record format writes what it takes from a document's or an event's BSON (the rest of the
/// record, the same in every event of a collection, is the format's template).
trait PartsFormat {
    /// The key's `id` as a JSON string into `out`, from the `_id` of a document (an event's
    /// `documentKey` or a read document).
    fn key_id(&self, out: &mut Vec<u8>, document: &[u8]) -> Written;
    /// A document as the JSON string of its text (`before`, `after`) into `out`.
    fn document(&self, out: &mut Vec<u8>, document: &[u8]) -> Written;
    /// The parts of an ordinary change event of operation `op` (insert, update, replace, delete).
    fn change_parts(&self, raw: &[u8], op: &str, pre_image: bool, update_full: bool) -> Result<Parts, Unsupported>;

    /// `document` of a member, or `null` when absent or null.
    fn document_or_null(&self, member: Option<(u8, &[u8])>) -> Result<Vec<u8>, Unsupported> {
        match member {
            None | Some((0x0a, _)) => Ok(b"null".to_vec()),
            Some((0x03, document)) => {
                let mut out = Vec::with_capacity(document.len() * 2);
                self.document(&mut out, document)?;
                Ok(out)
            }
            Some(_) => Err(Unsupported),
        }
    }
}

/// A format of the change streams envelope (`before`, `after`, `updateDescription`): the default
/// one and Debezium 3.x's.
trait EnvelopeFormat: PartsFormat {
    /// An update's `updateDescription` as JSON.
    fn update_description(&self, desc: &[u8]) -> Result<Vec<u8>, Unsupported>;
}

/// The members of a change event the formats write from: `documentKey`, `fullDocument`,
/// `updateDescription`, `fullDocumentBeforeChange`, `wallTime` (the last of a repeated name, as a
/// decoded dict keeps it).
struct EventMembers<'a> {
    key: Option<(u8, &'a [u8])>,
    full: Option<(u8, &'a [u8])>,
    desc: Option<(u8, &'a [u8])>,
    before: Option<(u8, &'a [u8])>,
    wall: Option<(u8, &'a [u8])>,
}

impl<'a> EventMembers<'a> {
    fn of(raw: &'a [u8]) -> Result<Self, Unsupported> {
        let mut found = EventMembers { key: None, full: None, desc: None, before: None, wall: None };
        for (name, kind, value) in members(raw).ok_or(Unsupported)? {
            match name {
                b"documentKey" => found.key = Some((kind, value)),
                b"fullDocument" => found.full = Some((kind, value)),
                b"updateDescription" => found.desc = Some((kind, value)),
                b"fullDocumentBeforeChange" => found.before = Some((kind, value)),
                b"wallTime" => found.wall = Some((kind, value)),
                _ => {}
            }
        }
        Ok(found)
    }

    /// The `documentKey` document, whose `_id` the key's `id` is written from.
    fn document_key(&self) -> Result<&'a [u8], Unsupported> {
        match self.key {
            Some((0x03, document)) => {
                let names = members(document).ok_or(Unsupported)?;
                if repeats(&mut names.iter().map(|(n, _, _)| *n).collect::<Vec<_>>()) {
                    return Err(Unsupported); // decoded as a dict, the last `_id` would win
                }
                Ok(document)
            }
            _ => Err(Unsupported),
        }
    }

    fn key_id<F: PartsFormat>(&self, format: &F) -> Result<Vec<u8>, Unsupported> {
        let mut key_id = Vec::with_capacity(48);
        format.key_id(&mut key_id, self.document_key()?)?;
        Ok(key_id)
    }
}

/// `PartsFormat::change_parts` of a change streams envelope format.
fn envelope_parts<F: EnvelopeFormat>(format: &F, raw: &[u8], op: &str, pre_image: bool, update_full: bool) -> Result<Parts, Unsupported> {
    let event = EventMembers::of(raw)?;
    let key_id = event.key_id(format)?;
    let before = format.document_or_null(if pre_image { event.before } else { None })?;
    let (after, update) = match op {
        "update" => {
            let update = match event.desc {
                Some((0x03, description)) => format.update_description(description)?,
                _ => return Err(Unsupported), // Python names the missing updateDescription
            };
            (format.document_or_null(if update_full { event.full } else { None })?, update)
        }
        "insert" | "replace" => {
            if !matches!(event.full, Some((0x03, _))) {
                return Err(Unsupported); // Python names the missing fullDocument
            }
            (format.document_or_null(event.full)?, b"null".to_vec())
        }
        "delete" => (b"null".to_vec(), b"null".to_vec()),
        _ => return Err(Unsupported),
    };
    let wall_ms = match event.wall {
        None | Some((0x0a, _)) => None,
        Some((0x09, value)) => Some(le_i64(value, 0).ok_or(Unsupported)?),
        Some(_) => return Err(Unsupported),
    };
    Ok(Parts { key_id, before, after, update, filter: Vec::new(), wall_ms })
}

/// mongocdc's default format (`mongocdc_core.events.envelope`): strict Extended JSON as orjson
/// spells it; with field rules, applied to whole documents and to an update's paths.
struct DefaultFormat<'a> {
    rules: Option<&'a rules::FieldRules>,
}

impl PartsFormat for DefaultFormat<'_> {
    /// ObjectId, int32, int64 and string `_id`s, in key-table style (`ejson.KEY_STYLE`, which spells
    /// these types as `LEGACY_STYLE` does); the Python path writes the others.
    fn key_id(&self, out: &mut Vec<u8>, document: &[u8]) -> Written {
        write_into(out, Writer::<LegacyStyle>::new, |writer| {
            walk::key_id(writer, document, |kind| matches!(kind, 0x07 | 0x10 | 0x12 | 0x02))
        })
    }

    fn document(&self, out: &mut Vec<u8>, document: &[u8]) -> Written {
        write_into(out, Writer::<DocumentStyle>::new, |writer| document_string(writer, document, self.rules))
    }

    fn change_parts(&self, raw: &[u8], op: &str, pre_image: bool, update_full: bool) -> Result<Parts, Unsupported> {
        envelope_parts(self, raw, op, pre_image, update_full)
    }
}

impl EnvelopeFormat for DefaultFormat<'_> {
    fn update_description(&self, desc: &[u8]) -> Result<Vec<u8>, Unsupported> {
        update_description(Writer::<DocumentStyle>::new(Vec::with_capacity(desc.len() * 2)), desc, self.rules, true)
    }
}

/// The 1.x oplog format (`mongocdc.event.format=oplog_1x`): `after` of
/// an insert or read and an event's `filter` (its `documentKey`) in `LEGACY_STYLE`, an update's or
/// replace's `patch` in `COMPACT_STYLE`, the key as the default format's; the field rules apply to
/// `after` and `patch`.
struct LegacyFormat<'a> {
    rules: Option<&'a rules::FieldRules>,
}

impl LegacyFormat<'_> {
    /// A whole document in style `S` (rules applied) as a JSON string into `out`.
    fn styled<S: Style>(out: &mut Vec<u8>, document: &[u8], rules: Option<&rules::FieldRules>) -> Written {
        write_into(out, Writer::<S>::new, |writer| document_string(writer, document, rules))
    }

    /// `styled` into a new buffer.
    fn styled_new<S: Style>(document: &[u8], rules: Option<&rules::FieldRules>) -> Result<Vec<u8>, Unsupported> {
        let mut out = Vec::with_capacity(document.len() * 2);
        Self::styled::<S>(&mut out, document, rules)?;
        Ok(out)
    }

    /// An update's `patch`: `{"$set": <updatedFields>, "$unset": {<removed>: true}}`, each only when
    /// not empty (`truncatedArrays` has no place in it).
    fn update_patch(&self, desc: &[u8]) -> Result<Vec<u8>, Unsupported> {
        let (updated, removed, _) = update_members(desc)?;
        let mut patch: Writer<CompactStyle> = Writer::new(Vec::with_capacity(desc.len() * 2));
        patch.out.extend_from_slice(b"\"{");
        let mut count = 0;
        if let Some(fields) = updated {
            let mark = patch.out.len();
            patch.out.extend_from_slice(b"\\\"$set\\\":");
            if updated_fields(&mut patch, fields, self.rules)? == 0 {
                patch.out.truncate(mark);
            } else {
                count += 1;
            }
        }
        let mut paths: Vec<Cow<'_, [u8]>> = Vec::new();
        for (_, kind, value) in optional_members(removed)? {
            let text = if kind == 0x02 { string_text(value).ok_or(Unsupported)? } else { return Err(Unsupported) };
            match ruled_path(text, self.rules)? {
                Some(path) if !paths.contains(&path) => paths.push(path), // a dict keeps the first of each
                _ => {}
            }
        }
        if !paths.is_empty() {
            if count > 0 {
                patch.out.push(b',');
            }
            patch.out.extend_from_slice(b"\\\"$unset\\\":{");
            for (i, path) in paths.iter().enumerate() {
                if i > 0 {
                    patch.out.push(b',');
                }
                patch.string(path)?;
                patch.out.extend_from_slice(b":true");
            }
            patch.out.push(b'}');
        }
        patch.out.extend_from_slice(b"}\"");
        Ok(patch.out)
    }
}

impl PartsFormat for LegacyFormat<'_> {
    fn key_id(&self, out: &mut Vec<u8>, document: &[u8]) -> Written {
        DefaultFormat { rules: None }.key_id(out, document)
    }

    fn document(&self, out: &mut Vec<u8>, document: &[u8]) -> Written {
        Self::styled::<LegacyStyle>(out, document, self.rules)
    }

    fn change_parts(&self, raw: &[u8], op: &str, _pre_image: bool, _update_full: bool) -> Result<Parts, Unsupported> {
        let event = EventMembers::of(raw)?;
        let key_id = event.key_id(self)?;
        let null = || b"null".to_vec();
        let filter = || Self::styled_new::<LegacyStyle>(event.document_key()?, None);
        let (after, update, filter) = match (op, event.full, event.desc) {
            ("insert", Some((0x03, document)), _) => (self.document_or_null(Some((0x03, document)))?, null(), null()),
            ("update", _, Some((0x03, desc))) => (null(), self.update_patch(desc)?, filter()?),
            ("replace", Some((0x03, document)), None | Some((0x0a, _))) => {
                (null(), Self::styled_new::<CompactStyle>(document, self.rules)?, filter()?)
            }
            ("delete", _, _) => (null(), null(), filter()?),
            _ => return Err(Unsupported), // a missing part: Python names it
        };
        Ok(Parts { key_id, before: null(), after, update, filter, wall_ms: None })
    }
}

/// One collection's change records in one format, whole: the key and the value written from an
/// event's BSON into the format's value template, so that Python makes no bytes of its own per event.
///
/// The template is given as its `pieces` around the slots, `slots` naming what each slot holds:
/// `b`, `a`, `u` (`before`, `after`, `updateDescription` or the 1.x `patch`), `f` (the 1.x `filter`),
/// `w` (`wallTime` ms or null), `o` (`op`), `i` (`source.ord`: the position's increment), `l`
/// (`lsid`, or the 1.x `stxnid`, given as JSON or null), `x` (`txnNumber` or null), `k`
/// (`transaction` block, given as JSON or null), `t` (the default format's
/// `source.ts_ms,"ts_us":…,"ts_ns":…` of the clusterTime's seconds), `S` (the clusterTime's seconds
/// in ms: the 1.x `source.ts_ms`), `E`, `F`, `G` (Debezium 3.x's `source.ts_ms`, `ts_us`, `ts_ns` of
/// the wallTime, else of the clusterTime), `M`, `U`, `N` (the processing time in ms, us, ns). The
/// parts are the default format's, Debezium 3.x's with `printable` (`java`), the 1.x format's with
/// `legacy` (`LegacyFormat`).
#[pyclass(frozen, module = "mongocdc_native")]
struct ChangeWriter {
    pieces: Vec<Vec<u8>>,
    slots: Vec<u8>,
    key_head: Vec<u8>,
    key_tail: Vec<u8>,
    printable: Option<Vec<u8>>,
    legacy: bool,
    rules: Option<Py<rules::FieldRules>>,
    pre_image: bool,
    update_full: bool,
}

/// Milliseconds whose nanoseconds fit a signed 64-bit number (Python's serializer refuses others).
const NS_MS_LIMIT: i64 = i64::MAX / 1_000_000;

fn push_int(out: &mut Vec<u8>, value: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

fn push_int_or_null(out: &mut Vec<u8>, value: Option<i64>) {
    match value {
        Some(value) => push_int(out, value),
        None => out.extend_from_slice(b"null"),
    }
}

/// The event of a change record: what the template's slots take besides the parts.
struct Event<'a> {
    op: &'a str,
    seconds: i64,
    increment: i64,
    txn_number: Option<i64>,
    lsid: Option<&'a [u8]>,
    now_ns: i64,
    block: Option<&'a [u8]>,
}

/// Where a change record's landing parts lie in its value (`ChangeWriter.write_landing`): the
/// `updateDescription` object (or `null`) and the `source` object, as byte ranges.
#[derive(Default)]
struct LandingSpans {
    update: (usize, usize),
    source: (usize, usize),
}

impl ChangeWriter {
    fn write_with<F: PartsFormat>(&self, format: &F, raw: &[u8], event: &Event<'_>) -> Result<(Vec<u8>, Vec<u8>, Option<i64>), Unsupported> {
        self.write_parts(format, raw, event, None).map(|(key, value, wall_ms, _)| (key, value, wall_ms))
    }

    /// `write_with`, also giving the record's `before` and `after` parts as written (JSON string literals
    /// or `null`) and, with `spans`, where its `updateDescription` and `source` lie in the value (Err when
    /// the template does not lay them out as the default format does).
    #[allow(clippy::type_complexity)]
    fn write_parts<F: PartsFormat>(
        &self,
        format: &F,
        raw: &[u8],
        event: &Event<'_>,
        mut spans: Option<&mut LandingSpans>,
    ) -> Result<(Vec<u8>, Vec<u8>, Option<i64>, (Vec<u8>, Vec<u8>)), Unsupported> {
        let Parts { key_id, before, after, update, filter, wall_ms } = format.change_parts(raw, event.op, self.pre_image, self.update_full)?;
        let op_json: &[u8] = match event.op {
            "insert" => b"\"c\"",
            "update" | "replace" => b"\"u\"",
            "delete" => b"\"d\"",
            _ => return Err(Unsupported),
        };
        let ts_ms = wall_ms.unwrap_or(event.seconds * 1000);
        let size = self.pieces.iter().map(Vec::len).sum::<usize>() + before.len() + after.len() + update.len() + filter.len() + 160;
        let mut out = Vec::with_capacity(size);
        let mut after_update = false;
        for (piece, slot) in self.pieces.iter().zip(self.slots.iter()) {
            if let Some(spans) = spans.as_deref_mut() {
                if after_update {
                    if !piece.starts_with(b",\"source\":{") {
                        return Err(Unsupported);
                    }
                    spans.source.0 = out.len() + 10;
                    after_update = false;
                }
                if *slot == b'o' {
                    if !piece.ends_with(b"},\"op\":") {
                        return Err(Unsupported);
                    }
                    spans.source.1 = out.len() + piece.len() - 6;
                }
            }
            out.extend_from_slice(piece);
            match slot {
                b'b' => out.extend_from_slice(&before),
                b'a' => out.extend_from_slice(&after),
                b'u' => {
                    if let Some(spans) = spans.as_deref_mut() {
                        spans.update = (out.len(), out.len() + update.len());
                        after_update = true;
                    }
                    out.extend_from_slice(&update)
                }
                b'f' => out.extend_from_slice(&filter),
                b'w' => push_int_or_null(&mut out, wall_ms),
                b'o' => out.extend_from_slice(op_json),
                b'i' => push_int(&mut out, event.increment),
                b'l' => out.extend_from_slice(event.lsid.unwrap_or(b"null")),
                b'x' => push_int_or_null(&mut out, event.txn_number),
                b'k' => out.extend_from_slice(event.block.unwrap_or(b"null")),
                b't' => {
                    let ns = event.seconds * 1_000_000_000;
                    push_int(&mut out, ns / 1_000_000);
                    out.extend_from_slice(b",\"ts_us\":");
                    push_int(&mut out, ns / 1_000);
                    out.extend_from_slice(b",\"ts_ns\":");
                    push_int(&mut out, ns);
                }
                b'S' => push_int(&mut out, event.seconds * 1000),
                b'E' | b'F' | b'G' => {
                    if !(-NS_MS_LIMIT..NS_MS_LIMIT).contains(&ts_ms) {
                        return Err(Unsupported); // source.ts_ns past 64 bits: the Python path refuses it
                    }
                    push_int(&mut out, ts_ms * [1, 1_000, 1_000_000][usize::from(slot - b'E')]);
                }
                b'M' => push_int(&mut out, event.now_ns.div_euclid(1_000_000)),
                b'U' => push_int(&mut out, event.now_ns.div_euclid(1_000)),
                b'N' => push_int(&mut out, event.now_ns),
                _ => return Err(Unsupported),
            }
        }
        out.extend_from_slice(self.pieces.last().map_or(&[][..], Vec::as_slice));
        let mut key = Vec::with_capacity(self.key_head.len() + key_id.len() + self.key_tail.len());
        key.extend_from_slice(&self.key_head);
        key.extend_from_slice(&key_id);
        key.extend_from_slice(&self.key_tail);
        if let Some(spans) = spans {
            if spans.source.0 == 0 || spans.source.1 <= spans.source.0 {
                return Err(Unsupported);
            }
        }
        Ok((key, out, wall_ms, (before, after)))
    }
}

#[pymethods]
impl ChangeWriter {
    #[new]
    #[pyo3(signature = (pieces, slots, key_head, key_tail, pre_image, update_full, printable=None, rules=None, legacy=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        pieces: Vec<Vec<u8>>,
        slots: &str,
        key_head: Vec<u8>,
        key_tail: Vec<u8>,
        pre_image: bool,
        update_full: bool,
        printable: Option<Vec<u8>>,
        rules: Option<Py<rules::FieldRules>>,
        legacy: bool,
    ) -> PyResult<Self> {
        if pieces.len() != slots.len() + 1 {
            return Err(PyValueError::new_err(format!("{} template pieces for {} slots", pieces.len(), slots.len())));
        }
        if let Some(bitmap) = &printable {
            if legacy {
                return Err(PyValueError::new_err("a writer of the 1.x format takes no printable bitmap"));
            }
            java::Debezium3::new(bitmap, None).map_err(PyValueError::new_err)?;
        }
        let slots = slots.as_bytes().to_vec();
        Ok(ChangeWriter { pieces, slots, key_head, key_tail, printable, legacy, rules, pre_image, update_full })
    }

    /// (key, value, `wallTime` ms or None) of an ordinary change event (its `ChangeHeader`: operation
    /// insert, update, replace or delete, clusterTime, txnNumber) at a position of `increment` (`ord`);
    /// None when the Python path writes it.
    #[pyo3(signature = (raw, header, increment, lsid, now_ns, block))]
    fn write<'py>(
        &self,
        py: Python<'py>,
        raw: &[u8],
        header: &Bound<'py, ChangeHeader>,
        increment: i64,
        lsid: Option<&[u8]>,
        now_ns: i64,
        block: Option<&[u8]>,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, Option<i64>)>> {
        let header = header.get();
        let op = header.op_type.bind(py).to_str()?;
        let (seconds, txn_number) = (i64::from(header.seconds), header.txn_number);
        let event = Event { op, seconds, increment, txn_number, lsid, now_ns, block };
        let rules = self.rules.as_ref().map(|r| r.get());
        let written = match &self.printable {
            None if self.legacy => self.write_with(&LegacyFormat { rules }, raw, &event),
            None => self.write_with(&DefaultFormat { rules }, raw, &event),
            Some(printable) => {
                let format = java::Debezium3::new(printable, rules).map_err(PyValueError::new_err)?;
                self.write_with(&format, raw, &event)
            }
        };
        let Ok((key, value, wall_ms)) = written else { return Ok(None) };
        Ok(Some((PyBytes::new(py, &key), PyBytes::new(py, &value), wall_ms)))
    }

    /// `write` of the default or the Debezium 3.x format, also appending the record's landing row to `into`
    /// (see `landing::ChangeLanding`) at its position (`seconds`, `increment`, `ordinal`), taken from the parts
    /// as they are written: (key, value, `wallTime` ms or None, its `LandingRow`, or None when `into` could not
    /// take it); None when `write` would give None; a ValueError in the 1.x format (no such columns).
    #[pyo3(signature = (raw, header, increment, lsid, now_ns, block, into, seconds, ordinal))]
    #[allow(clippy::type_complexity)]
    #[allow(clippy::too_many_arguments)]
    fn write_landing<'py>(
        &self,
        py: Python<'py>,
        raw: &[u8],
        header: &Bound<'py, ChangeHeader>,
        increment: i64,
        lsid: Option<&[u8]>,
        now_ns: i64,
        block: Option<&[u8]>,
        into: &Bound<'py, landing::ChangeLanding>,
        seconds: i64,
        ordinal: i64,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, Option<i64>, Option<landing::LandingRow>)>> {
        if self.legacy {
            return Err(PyValueError::new_err("write_landing writes the default and Debezium 3.x formats' records only (see EventConverter)"));
        }
        let header = header.get();
        let op = header.op_type.bind(py).to_str()?;
        let event = Event { op, seconds: i64::from(header.seconds), increment, txn_number: header.txn_number, lsid, now_ns, block };
        let rules = self.rules.as_ref().map(|r| r.get());
        let position = [seconds, increment, ordinal];
        let landed = match &self.printable {
            None => self.landed(py, &DefaultFormat { rules }, raw, &event, into, position)?,
            Some(printable) => {
                let format = java::Debezium3::new(printable, rules).map_err(PyValueError::new_err)?;
                self.landed(py, &format, raw, &event, into, position)?
            }
        };
        let Some((key, value, wall_ms, row)) = landed else { return Ok(None) };
        Ok(Some((PyBytes::new(py, &key), PyBytes::new(py, &value), wall_ms, row)))
    }
}

/// A record as `write_landing` writes it: key, value, `wallTime` ms, and its landing row (None: not taken).
type Landed = (Vec<u8>, Vec<u8>, Option<i64>, Option<landing::LandingRow>);

impl ChangeWriter {
    /// `write_landing` in one format: the record and its row, or the record alone when its template is not
    /// laid out as the landing reads it; None when `write` would give None.
    fn landed<F: PartsFormat>(
        &self,
        py: Python<'_>,
        format: &F,
        raw: &[u8],
        event: &Event<'_>,
        into: &Bound<'_, landing::ChangeLanding>,
        position: [i64; 3],
    ) -> PyResult<Option<Landed>> {
        let mut spans = LandingSpans::default();
        Ok(match self.write_parts(format, raw, event, Some(&mut spans)) {
            Ok((key, value, wall_ms, (before, after))) => {
                let letter: &[u8] = match event.op {
                    "insert" => b"c",
                    "delete" => b"d",
                    _ => b"u",
                };
                let spans = (spans.update, spans.source);
                let ts_ms = event.now_ns.div_euclid(1_000_000);
                let row = into.borrow_mut().push_change(py, &key, &value, &before, &after, spans, ts_ms, position, letter)?;
                Some((key, value, wall_ms, row))
            }
            Err(_) => self.write_with(format, raw, event).ok().map(|(key, value, wall_ms)| (key, value, wall_ms, None)),
        })
    }
}

/// The BSON of the top-level embedded document `name` of `raw` (the last, when repeated), or None.
#[pyfunction]
fn document_member<'py>(py: Python<'py>, raw: &[u8], name: &str) -> Option<Bound<'py, PyBytes>> {
    let found = members(raw)?.into_iter().rev().find(|(n, _, _)| *n == name.as_bytes())?;
    (found.1 == 0x03).then(|| PyBytes::new(py, found.2))
}

#[pymodule]
fn mongocdc_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(document_bounds, module)?)?;
    module.add_function(wrap_pyfunction!(convert_reads, module)?)?;
    module.add_function(wrap_pyfunction!(cursor_batch, module)?)?;
    module.add_function(wrap_pyfunction!(change_header, module)?)?;
    module.add_function(wrap_pyfunction!(document_member, module)?)?;
    module.add_function(wrap_pyfunction!(landing::landing_columns, module)?)?;
    module.add_function(wrap_pyfunction!(landing::run_landing_columns, module)?)?;
    module.add_function(wrap_pyfunction!(landing::run_payloads, module)?)?;
    module.add_class::<landing::Buffer>()?;
    module.add_class::<landing::ChangeLanding>()?;
    module.add_class::<landing::LandingRow>()?;
    module.add_function(wrap_pyfunction!(landing::take_rows, module)?)?;
    module.add_class::<rules::FieldRules>()?;
    module.add_class::<ChangeWriter>()?;
    module.add_class::<ChangeHeader>()?;
    Ok(())
}
