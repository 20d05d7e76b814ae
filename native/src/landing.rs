//! Landing-zone columns straight from record bytes, for the Parquet sink.
//!
//! A landing row holds the payload's `before`, `after` and `updateDescription` texts unescaped, so
//! a sink given record bytes must parse every payload. Arrow's JSON reader alone cost that sink more
//! than its whole Parquet write; here each payload is walked once, the wanted members are unescaped
//! into Arrow's own buffer layout (offsets, data, validity), and Python wraps the buffers without a
//! Python object per value. Anything outside the strict JSON these records are written in (a member
//! of another type, an escaped member name, a lone surrogate or a number beyond a double anywhere, a
//! repeated member, a `source` block not laid out as the connector writes it, a 2 GiB column) makes
//! the whole batch go to the Arrow reader, so both ways give the same columns.

use std::os::raw::{c_int, c_void};
use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

/// The batch needs the Arrow reader (a form not handled here).
struct Fallback;

type Parsed<T> = Result<T, Fallback>;

/// One Arrow `string` column being built: i32 offsets, UTF-8 data, validity bits.
struct Strings {
    offsets: Vec<i32>,
    data: Vec<u8>,
    valid: Vec<u8>,
    nulls: usize,
}

impl Strings {
    fn new(rows: usize, bytes: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Strings {
            offsets,
            data: spare(bytes),
            valid: Vec::with_capacity(rows.div_ceil(8)),
            nulls: 0,
        }
    }

    /// Ends the current row as a value (`true`) or a null, after its bytes were appended to `data`.
    fn end(&mut self, present: bool) -> Parsed<()> {
        bit(&mut self.valid, self.offsets.len() - 1, present);
        self.nulls += usize::from(!present);
        self.offsets.push(i32::try_from(self.data.len()).map_err(|_| Fallback)?);
        Ok(())
    }

    /// Appends a copy of row `row`'s cell (its bytes and whether it is null).
    fn repeat(&mut self, row: usize) -> Parsed<()> {
        let (start, end) = (self.offsets[row] as usize, self.offsets[row + 1] as usize);
        self.data.extend_from_within(start..end);
        self.end(is_set(&self.valid, row))
    }

    fn push(&mut self, text: Option<&[u8]>) -> Parsed<()> {
        if let Some(text) = text {
            self.data.extend_from_slice(text);
        }
        self.end(text.is_some())
    }

    fn into_py(self, py: Python<'_>) -> PyResult<StringsOut<'_>> {
        Ok((
            Buffer::new(py, Words::I32(self.offsets))?,
            Buffer::new(py, Words::U8(self.data))?,
            Buffer::new(py, Words::U8(self.valid))?,
            self.nulls,
        ))
    }
}

/// A string column for Python: offsets (i32), data, validity bitmap, null count.
type StringsOut<'py> = (Bound<'py, Buffer>, Bound<'py, Buffer>, Bound<'py, Buffer>, usize);

/// The memory behind a [`Buffer`]: the walk's vectors as they were built.
enum Words {
    U8(Vec<u8>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl Words {
    /// Where the vector's elements start, and their size in bytes.
    fn raw(&self) -> (*const u8, usize) {
        match self {
            Words::U8(v) => (v.as_ptr(), v.len()),
            Words::I32(v) => (v.as_ptr().cast(), std::mem::size_of_val(v.as_slice())),
            Words::I64(v) => (v.as_ptr().cast(), std::mem::size_of_val(v.as_slice())),
        }
    }
}

/// Large data vectors of dropped [`Buffer`]s, kept to be written again, and the bytes they hold. A
/// batch's columns are megabytes, and fresh memory costs a page fault per 4 KiB as it is first written:
/// measured, those faults were a seventh of the sink's time, which reused vectors no longer pay. Small
/// vectors (validity bitmaps, a quiet stream's batches) come from the allocator's own free lists.
static SPARE: Mutex<Spare> = Mutex::new(Spare { vectors: Vec::new(), bytes: 0 });
/// At most this many bytes in at most [`SPARE_COUNT`] vectors, each of at least [`SPARE_MIN`] bytes. The
/// bytes are the bound: a row group of change rows is chunks of five large columns each (keys, values,
/// `after`, `source`, `updatedFields`), and 32 vectors, filled by the small ones dropped first, kept a
/// quarter of those 64 MiB and left most values' columns to fresh memory.
const SPARE_BYTES: usize = 64 << 20;
const SPARE_COUNT: usize = 128;
const SPARE_MIN: usize = 64 << 10;

struct Spare {
    vectors: Vec<Vec<u8>>,
    bytes: usize,
}

/// An empty vector for at least `bytes`: the smallest spare one that holds them, or a new one (always
/// new below [`SPARE_MIN`], so a column that stays small does not hold a large vector).
fn spare(bytes: usize) -> Vec<u8> {
    if bytes < SPARE_MIN {
        return Vec::with_capacity(bytes);
    }
    let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
    let fits = spare
        .vectors
        .iter()
        .enumerate()
        .filter(|(_, v)| v.capacity() >= bytes)
        .min_by_key(|(_, v)| v.capacity())
        .map(|(i, _)| i);
    match fits {
        Some(i) => {
            let data = spare.vectors.swap_remove(i);
            spare.bytes -= data.capacity();
            data
        }
        None => Vec::with_capacity(bytes),
    }
}

/// Keeps `data` for [`spare`] when it is large and the pool has room for it.
fn give_back(mut data: Vec<u8>) {
    if data.capacity() < SPARE_MIN {
        return;
    }
    let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
    if spare.vectors.len() < SPARE_COUNT && spare.bytes + data.capacity() <= SPARE_BYTES {
        data.clear();
        spare.bytes += data.capacity();
        spare.vectors.push(data);
    }
}

/// A column buffer the walk wrote, lent to Python through the buffer protocol instead of copied into a
/// `bytes` object: Arrow wraps it as it is (`pa.py_buffer`), so a batch's megabytes are neither copied
/// nor faulted in a second time. Numbers are in the machine's byte order, which is Arrow's.
#[pyclass(frozen, module = "mongocdc_native")]
pub struct Buffer(Words);

impl Buffer {
    fn new(py: Python<'_>, words: Words) -> PyResult<Bound<'_, Buffer>> {
        Bound::new(py, Buffer(words))
    }
}

/// The text of the JSON string `literal` (quotes included) appended to `out`, its escapes resolved as
/// the walk resolves them; false (and `out` as it was) when it is not one string the walk reads.
pub(crate) fn unescape_into(literal: &[u8], out: &mut Vec<u8>) -> bool {
    let mark = out.len();
    let mut json = Json { b: literal, i: 0, sources: 0, ops: 0, high: 0 };
    if json.string_into(out).is_err() || json.i != literal.len() {
        out.truncate(mark);
        return false;
    }
    true
}

/// The `after` column of a snapshot chunk's reads, written by the converter as it writes their records
/// (`convert_reads` with `landing`): each read's document text, the JSON string it just wrote unescaped
/// while its bytes are still in the processor's cache, so the Parquet sink takes the column as it is
/// instead of walking every record's payload again.
pub(crate) struct Afters {
    offsets: Vec<i32>,
    data: Vec<u8>,
    /// Whether the column can still be given (false past Arrow's 2 GiB of a string column).
    whole: bool,
}

impl Afters {
    pub(crate) fn new(rows: usize, bytes: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Afters { offsets, data: spare(bytes), whole: true }
    }

    /// Appends the text of the JSON string `literal` (quotes included), as the walk resolves its escapes;
    /// an empty row for a read the converter left to Python (its chunk then becomes a list, not a run,
    /// and the column is not used).
    pub(crate) fn push(&mut self, literal: Option<&[u8]>) {
        if let Some(literal) = literal {
            if !unescape_into(literal, &mut self.data) {
                self.whole = false; // not a string the walk reads: the sink walks the chunk instead
            }
        }
        match i32::try_from(self.data.len()) {
            Ok(end) => self.offsets.push(end),
            Err(_) => {
                self.whole = false;
                self.offsets.push(0);
            }
        }
    }

    /// (offsets, data) for Python, or None when the column could not be written whole.
    pub(crate) fn into_py(self, py: Python<'_>) -> PyResult<Option<(Bound<'_, Buffer>, Bound<'_, Buffer>)>> {
        if !self.whole {
            give_back(self.data);
            return Ok(None);
        }
        Ok(Some((Buffer::new(py, Words::I32(self.offsets))?, Buffer::new(py, Words::U8(self.data))?)))
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Words::U8(data) = &mut self.0 {
            give_back(std::mem::take(data));
        }
    }
}

#[pymethods]
impl Buffer {
    /// A read-only, contiguous view of the bytes (no copy).
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let (data, len) = slf.get().0.raw();
        let len = isize::try_from(len).map_err(|_| PyValueError::new_err("buffer larger than isize::MAX"))?;
        // SAFETY: the view holds a reference to `slf`, whose vector is never changed (the class is
        // frozen), so `data` stays valid for `len` bytes as long as the view lives.
        if unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), data.cast_mut().cast::<c_void>(), len, 1, flags) } == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.0.raw().1
    }
}

/// The `removedFields` column: a list of strings per row.
struct Lists {
    offsets: Vec<i32>,
    valid: Vec<u8>,
    nulls: usize,
    items: Strings,
}

impl Lists {
    /// Ends the current row as a list (`true`) of the items appended since the last row, or a null.
    fn end(&mut self, present: bool) -> Parsed<()> {
        let row = self.offsets.len() - 1;
        let items = self.items.offsets.len() - 1;
        self.offsets.push(i32::try_from(items).map_err(|_| Fallback)?);
        bit(&mut self.valid, row, present);
        self.nulls += usize::from(!present);
        Ok(())
    }
}

/// The columns of one batch, in the order `landing_columns` returns them.
struct Columns {
    keys: Strings,
    values: Strings,
    ts_ms: Vec<i64>,
    ts_valid: Vec<u8>,
    ts_nulls: usize,
    before: Strings,
    after: Strings,
    updated: Strings,
    removed: Lists,
    truncated: Strings,
    snapshot: Strings,
    source: Strings,
}

/// The members of a payload this module takes, found in one pass. The texts of `before`, `after`,
/// `updatedFields`, the `removedFields` items and `source.snapshot` are unescaped straight into their
/// columns as the walk meets them; these slots only say whether each was there (`Some(true)`: a string,
/// `Some(false)`: null, None: absent).
#[derive(Default)]
struct Payload<'a> {
    ts_ms: Option<Option<i64>>,
    before: Option<bool>,
    after: Option<bool>,
    /// Where the `after` string lies in the payload, quotes included.
    after_span: Option<(usize, usize)>,
    update: Option<Option<Update<'a>>>,
    source: Option<Option<Source<'a>>>,
    /// Whether the payload is ASCII throughout (else it still needs its UTF-8 checked).
    ascii: bool,
}

#[derive(Default)]
struct Update<'a> {
    updated: Option<bool>,
    removed: Option<bool>,
    truncated: Option<Option<&'a [u8]>>,
}

struct Source<'a> {
    text: &'a [u8],
    snapshot: Option<bool>,
}

/// A JSON string's contents as written (escapes not yet resolved).
#[derive(Clone, Copy)]
struct Span<'a> {
    raw: &'a [u8],
    escaped: bool,
}

/// Sets a member seen once; a repeated member goes to the Arrow reader (which decides which wins).
fn once<T>(slot: &mut Option<T>, value: T) -> Parsed<()> {
    if slot.is_some() {
        return Err(Fallback);
    }
    *slot = Some(value);
    Ok(())
}

/// A cursor over strict JSON (RFC 8259).
struct Json<'a> {
    b: &'a [u8],
    i: usize,
    /// Members named `source` and `op` at any depth: the Arrow-reader path cuts the `source` text at
    /// `,"source":{` … `},"op":`, which is unambiguous only when each occurs once.
    sources: u32,
    ops: u32,
    /// Every string byte the walk passed over, OR-ed together (a little more: whole words): while its
    /// high bits are clear, the payload is ASCII (outside strings the grammar allows nothing else), so
    /// it needs no UTF-8 check of its own.
    high: u64,
}

impl<'a> Json<'a> {
    /// Whether every string byte passed over so far is ASCII (see `high`).
    fn ascii(&self) -> bool {
        self.high & HIGH == 0
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// Skips blanks; a line break sends the batch to the reader, which reads one payload per line.
    fn blank(&mut self) -> Parsed<()> {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.i += 1,
                b'\n' | b'\r' => return Err(Fallback),
                _ => break,
            }
        }
        Ok(())
    }

    fn expect(&mut self, byte: u8) -> Parsed<()> {
        self.blank()?;
        if self.peek() != Some(byte) {
            return Err(Fallback);
        }
        self.i += 1;
        Ok(())
    }

    /// A string starting at the cursor: its contents as written, checked (escapes, no control characters).
    fn string(&mut self) -> Parsed<Span<'a>> {
        self.expect(b'"')?;
        let start = self.i;
        let mut escaped = false;
        loop {
            self.i = plain_run(self.b, self.i, &mut self.high);
            match self.b.get(self.i) {
                Some(b'"') => {
                    self.i += 1;
                    return Ok(Span {
                        raw: &self.b[start..self.i - 1],
                        escaped,
                    });
                }
                Some(b'\\') => {}
                _ => return Err(Fallback),
            }
            escaped = true;
            self.i += self.escape(self.i)?.0;
        }
    }

    /// A string starting at the cursor, checked, its contents appended to `out` with their escapes
    /// resolved, in the same pass (the texts kept are most of a payload's bytes). Plain contents are
    /// copied eight bytes at a time as they are searched: an escaped document such as `after` has a run
    /// per quote, and a copy call per run cost more than the search.
    fn string_into(&mut self, out: &mut Vec<u8>) -> Parsed<()> {
        self.expect(b'"')?;
        let b = self.b;
        let (start, mut i) = (self.i, self.i);
        // Resolved contents are never longer than written ones, so the rest of the text bounds them.
        out.reserve(b.len() - start);
        let (dst, mut w) = (out.as_mut_ptr(), out.len());
        loop {
            loop {
                let Some(chunk) = b.get(i..i + 8) else {
                    while let Some(&c) = b.get(i).filter(|&&c| !SPECIAL[c as usize]) {
                        self.high |= u64::from(c);
                        // SAFETY: `w` is within the reserved capacity (see the word's store below).
                        unsafe { dst.add(w).write(c) };
                        (i, w) = (i + 1, w + 1);
                    }
                    break;
                };
                let bytes: [u8; 8] = chunk.try_into().unwrap_or_default();
                // SAFETY: each step writes at most the bytes it reads (`w - len <= i - start`, `len` being
                // the length `out` had), and this word lies within the text (`i + 8 <= b.len()`), so
                // `w + 8 <= len + b.len() - start`: within the capacity reserved above. Bytes past the
                // run are written over by the next step or left past the length set at the end.
                unsafe { dst.add(w).cast::<[u8; 8]>().write_unaligned(bytes) };
                let word = u64::from_le_bytes(bytes);
                self.high |= word;
                let found = special_bytes(word);
                if found != 0 {
                    let k = (found.trailing_zeros() / 8) as usize;
                    (i, w) = (i + k, w + k);
                    break;
                }
                (i, w) = (i + 8, w + 8);
            }
            match b.get(i) {
                Some(b'"') => {
                    // SAFETY: every byte below `w` was written above, within the capacity.
                    unsafe { out.set_len(w) };
                    self.i = i + 1;
                    return Ok(());
                }
                Some(b'\\') => {}
                _ => return Err(Fallback),
            }
            let (read, utf8, len) = self.escape(i)?;
            // SAFETY: an escape stands for fewer bytes than it is written with (`len < read`), and
            // `escape` read all of it from the text (`i + read <= b.len()`).
            unsafe { std::ptr::copy_nonoverlapping(utf8.as_ptr(), dst.add(w), len) };
            (i, w) = (i + read, w + len);
        }
    }

    /// The escape whose backslash is at `at`: how many bytes it takes, and the UTF-8 it stands for (in
    /// the first `len` of four bytes). A surrogate must come as a high-low pair (both readers refuse a
    /// lone one).
    fn escape(&self, at: usize) -> Parsed<(usize, [u8; 4], usize)> {
        let next = *self.b.get(at + 1).ok_or(Fallback)?;
        let simple = ESCAPED[next as usize];
        if simple != 0 {
            return Ok((2, [simple, 0, 0, 0], 1));
        }
        if next != b'u' {
            return Err(Fallback);
        }
        let mut code = self.code_unit(at)?;
        let mut read = 6;
        if (0xDC00..0xE000).contains(&code) {
            return Err(Fallback);
        }
        if (0xD800..0xDC00).contains(&code) {
            if self.b.get(at + 6) != Some(&b'\\') {
                return Err(Fallback);
            }
            let low = self.code_unit(at + 6)?;
            if !(0xDC00..0xE000).contains(&low) {
                return Err(Fallback);
            }
            read = 12;
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        }
        let mut utf8 = [0; 4];
        let len = char::from_u32(code).ok_or(Fallback)?.encode_utf8(&mut utf8).len();
        Ok((read, utf8, len))
    }

    /// The code unit of the `\\uXXXX` escape at `at`.
    fn code_unit(&self, at: usize) -> Parsed<u32> {
        let escape = self.b.get(at..at + 6).ok_or(Fallback)?;
        if escape[1] != b'u' || !escape[2..].iter().all(u8::is_ascii_hexdigit) {
            return Err(Fallback);
        }
        Ok(hex4(&escape[2..]))
    }

    /// A member name, which must be written without escapes (an escaped name could spell a wanted one).
    fn name(&mut self) -> Parsed<&'a [u8]> {
        let span = self.string()?;
        if span.escaped {
            return Err(Fallback);
        }
        self.expect(b':')?;
        Ok(span.raw)
    }

    fn literal(&mut self, word: &[u8]) -> Parsed<()> {
        if !self.b[self.i..].starts_with(word) {
            return Err(Fallback);
        }
        self.i += word.len();
        Ok(())
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        self.i - start
    }

    /// A number's text, checked against JSON's grammar.
    fn number(&mut self) -> Parsed<&'a [u8]> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        let whole = self.digits();
        if whole == 0 || (whole > 1 && self.b[self.i - whole] == b'0') {
            return Err(Fallback);
        }
        let mut integral = true;
        if self.peek() == Some(b'.') {
            self.i += 1;
            integral = false;
            if self.digits() == 0 {
                return Err(Fallback);
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            integral = false;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(Fallback);
            }
        }
        let text = &self.b[start..self.i];
        // Both readers refuse a number beyond a double's range (such as 1e999); an integer of at most 308
        // digits cannot be (one of 309 can: 10^308 is the last power of ten below f64::MAX).
        if text.len() > 308 || !integral {
            let value: f64 = std::str::from_utf8(text)
                .ok()
                .and_then(|t| t.parse().ok())
                .ok_or(Fallback)?;
            if !value.is_finite() {
                return Err(Fallback);
            }
        }
        Ok(text)
    }

    /// `null` (None) or the value read by `read`.
    fn nullable<T>(&mut self, read: impl FnOnce(&mut Self) -> Parsed<T>) -> Parsed<Option<T>> {
        self.blank()?;
        if self.peek() == Some(b'n') {
            self.literal(b"null")?;
            return Ok(None);
        }
        read(self).map(Some)
    }

    /// Skips one value of any kind, checking it.
    fn skip(&mut self, depth: u32) -> Parsed<()> {
        if depth > 200 {
            return Err(Fallback);
        }
        self.blank()?;
        match self.peek().ok_or(Fallback)? {
            b'"' => self.string().map(drop),
            b'{' => self.object(|json, _| json.skip(depth + 1)),
            b'[' => self.array(|json| json.skip(depth + 1)),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number().map(drop),
        }
    }

    /// An object at the cursor; `member` reads each member's value given its name.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a [u8]) -> Parsed<()>) -> Parsed<()> {
        self.expect(b'{')?;
        self.blank()?;
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            let name = self.name()?;
            self.sources += u32::from(name == b"source");
            self.ops += u32::from(name == b"op");
            member(self, name)?;
            self.blank()?;
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(Fallback),
            }
        }
    }

    /// An array at the cursor; `item` reads each item.
    fn array(&mut self, mut item: impl FnMut(&mut Self) -> Parsed<()>) -> Parsed<()> {
        self.expect(b'[')?;
        self.blank()?;
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(());
        }
        loop {
            item(self)?;
            self.blank()?;
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(Fallback),
            }
        }
    }

    /// The raw text of the value at the cursor.
    fn raw_value(&mut self) -> Parsed<&'a [u8]> {
        self.blank()?;
        let start = self.i;
        self.skip(0)?;
        Ok(&self.b[start..self.i])
    }
}

/// An integer that Arrow reads into int64 (a fraction, exponent or overflow goes to the reader).
fn integer(text: &[u8]) -> Parsed<i64> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or(Fallback)
}

/// A nullable string member unescaped into `column`: whether it was a string (false: null).
fn text_into(json: &mut Json<'_>, column: &mut Strings) -> Parsed<bool> {
    Ok(json.nullable(|json| json.string_into(&mut column.data))?.is_some())
}

fn update<'a>(json: &mut Json<'a>, out: &mut Columns) -> Parsed<Update<'a>> {
    let mut update = Update::default();
    json.object(|json, name| match name {
        b"updatedFields" => {
            let present = text_into(json, &mut out.updated)?;
            once(&mut update.updated, present)
        }
        b"removedFields" => {
            let items = &mut out.removed.items;
            let value = json.nullable(|json| {
                json.array(|json| {
                    json.blank()?;
                    json.string_into(&mut items.data)?;
                    items.end(true)
                })
            })?;
            once(&mut update.removed, value.is_some())
        }
        b"truncatedArrays" => {
            let value = json.nullable(|json| {
                json.blank()?;
                if json.peek() != Some(b'[') {
                    return Err(Fallback);
                }
                json.raw_value()
            })?;
            once(&mut update.truncated, value)
        }
        _ => json.skip(1),
    })?;
    Ok(update)
}

/// The `source` object; its text is taken only where the Arrow-reader path cuts the same text: written
/// as `,"source":{…},"op":` with no nested object (the connector's layout). Another layout goes to the
/// reader path, which writes the parsed block again.
fn source<'a>(json: &mut Json<'a>, out: &mut Columns) -> Parsed<Source<'a>> {
    if !json.b[..json.i].ends_with(b",\"source\":") {
        return Err(Fallback);
    }
    let start = json.i;
    let mut snapshot = None;
    json.object(|json, name| match name {
        b"snapshot" => {
            let present = text_into(json, &mut out.snapshot)?;
            once(&mut snapshot, present)
        }
        _ => json.skip(1),
    })?;
    let text = &json.b[start..json.i];
    // One `{` and one `}` in all: the block's own (a brace in a string would confuse the reader path's cut).
    let braces = text.iter().fold(0u32, |n, &c| n + u32::from(c == b'{' || c == b'}'));
    if !json.b[json.i..].starts_with(b",\"op\":") || braces != 2 {
        return Err(Fallback);
    }
    Ok(Source { text, snapshot })
}

/// The members of one payload, its texts appended to `out`'s columns (the row is ended by the caller).
fn payload<'a>(text: &'a [u8], out: &mut Columns) -> Parsed<Payload<'a>> {
    let mut json = Json {
        b: text,
        i: 0,
        sources: 0,
        ops: 0,
        high: 0,
    };
    let mut found = Payload::default();
    json.object(|json, name| match name {
        b"ts_ms" => {
            let value = json.nullable(|json| integer(json.number()?))?;
            once(&mut found.ts_ms, value)
        }
        b"before" => {
            let present = text_into(json, &mut out.before)?;
            once(&mut found.before, present)
        }
        b"after" => {
            json.blank()?;
            let start = json.i;
            let present = text_into(json, &mut out.after)?;
            found.after_span = present.then_some((start, json.i));
            once(&mut found.after, present)
        }
        b"updateDescription" => {
            let value = json.nullable(|json| update(json, out))?;
            once(&mut found.update, value)
        }
        b"source" => {
            let value = json.nullable(|json| source(json, out))?;
            once(&mut found.source, value)
        }
        _ => json.skip(1),
    })?;
    json.blank()?;
    if json.i != text.len() || (matches!(found.source, Some(Some(_))) && (json.sources, json.ops) != (1, 1)) {
        return Err(Fallback);
    }
    found.ascii = json.ascii();
    Ok(found)
}

/// The bytes that end a run of a JSON string's plain contents: a quote, a backslash, a control character.
static SPECIAL: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        table[c] = true;
        c += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// What each one-character escape stands for (0: not one; `\u` is read apart).
static ESCAPED: [u8; 256] = {
    let mut table = [0; 256];
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table[b'/' as usize] = b'/';
    table[b'b' as usize] = 0x08;
    table[b'f' as usize] = 0x0c;
    table[b'n' as usize] = b'\n';
    table[b'r' as usize] = b'\r';
    table[b't' as usize] = b'\t';
    table
};

/// A byte of ones in every lane, and the lanes' high bits: the constants of the eight-bytes-at-once
/// searches (a lane's high bit is set by `(x - ONES) & !x` when it is zero).
const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Where the plain run of string contents starting at `at` ends: the first quote, backslash or control
/// character, or the end; eight bytes per step ([`special_bytes`]), each OR-ed into `high`.
fn plain_run(b: &[u8], mut at: usize, high: &mut u64) -> usize {
    while let Some(chunk) = b.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        *high |= word;
        let found = special_bytes(word);
        if found != 0 {
            return at + (found.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while let Some(&c) = b.get(at).filter(|&&c| !SPECIAL[c as usize]) {
        *high |= u64::from(c);
        at += 1;
    }
    at
}

/// The high bit of each byte of `word` (little-endian) that may be a quote, a backslash or a control
/// character: the lowest one set always is one (the subtractions' borrows only flag bytes above it).
fn special_bytes(word: u64) -> u64 {
    let quote = word ^ (ONES * u64::from(b'"'));
    let backslash = word ^ (ONES * u64::from(b'\\'));
    (quote.wrapping_sub(ONES) & !quote | backslash.wrapping_sub(ONES) & !backslash | word.wrapping_sub(ONES * 0x20) & !word)
        & HIGH
}

fn hex4(raw: &[u8]) -> u32 {
    raw.iter()
        .fold(0, |n, &c| n * 16 + (c as char).to_digit(16).unwrap_or(0))
}

/// The payload of a key or value: after `head` when it starts with it (the topic's schema part),
/// as it is when it has no schema part; a schema part of another shape goes to the reader. `framed`:
/// the converter wrote every record of the batch after `head` (see `landing_columns`), so its bytes
/// are not compared again.
fn cut<'a>(raw: &'a [u8], head: Option<&[u8]>, framed: bool) -> Parsed<&'a [u8]> {
    if let Some(head) = head {
        if raw.len() > head.len() && (framed || raw.starts_with(head)) && raw.ends_with(b"}") {
            return Ok(&raw[head.len()..raw.len() - 1]);
        }
    }
    if raw.starts_with(b"{\"schema\":") {
        return Err(Fallback);
    }
    Ok(raw)
}

fn is_set(valid: &[u8], row: usize) -> bool {
    valid[row / 8] >> (row % 8) & 1 == 1
}

fn bit(valid: &mut Vec<u8>, row: usize, present: bool) {
    if row.is_multiple_of(8) {
        valid.push(0);
    }
    if present {
        valid[row / 8] |= 1 << (row % 8);
    }
}

/// A payload walked in full whose `after` is a string, and its row: the next payloads that differ from
/// it only in that string (a snapshot chunk's reads: one template around each document) take every
/// other cell from its row, and only their `after` string is read.
struct Frame<'a> {
    payload: &'a [u8],
    after: (usize, usize),
    row: usize,
}

impl Columns {
    /// Appends the row of `payload` when it is `frame`'s payload with another `after` string (false, and
    /// nothing appended, when it is not: the caller walks it in full). Every byte around the string
    /// equals the frame's, which the walk checked, and the string itself is checked as it is read.
    fn framed(&mut self, payload: &[u8], frame: &Frame<'_>) -> Parsed<bool> {
        let (start, end) = frame.after;
        let suffix = &frame.payload[end..];
        if payload.len() < start + suffix.len()
            || payload[..start] != frame.payload[..start]
            || !payload.ends_with(suffix)
        {
            return Ok(false);
        }
        let mark = self.after.data.len();
        let mut json = Json {
            b: payload,
            i: start,
            sources: 0,
            ops: 0,
            high: 0,
        };
        // The bytes around the string are the frame's, checked as UTF-8 when it was walked; the string's
        // own are checked where the walk met a byte beyond ASCII.
        let middle = &payload[start..payload.len() - suffix.len()];
        if json.string_into(&mut self.after.data).is_err()
            || json.i != payload.len() - suffix.len()
            || (!json.ascii() && std::str::from_utf8(middle).is_err())
        {
            self.after.data.truncate(mark);
            return Ok(false);
        }
        let row = frame.row;
        self.push_ts(is_set(&self.ts_valid, row).then_some(self.ts_ms[row]));
        self.before.repeat(row)?;
        self.after.end(true)?;
        self.updated.repeat(row)?;
        let (first, last) = (self.removed.offsets[row] as usize, self.removed.offsets[row + 1] as usize);
        for item in first..last {
            self.removed.items.repeat(item)?;
        }
        self.removed.end(is_set(&self.removed.valid, row))?;
        self.truncated.repeat(row)?;
        self.snapshot.repeat(row)?;
        self.source.repeat(row)?;
        Ok(true)
    }

    /// Ends the current row's `ts_ms` (None: null).
    fn push_ts(&mut self, ts: Option<i64>) {
        let row = self.ts_ms.len();
        self.ts_ms.push(ts.unwrap_or(0));
        bit(&mut self.ts_valid, row, ts.is_some());
        self.ts_nulls += usize::from(ts.is_none());
    }
}

fn columns(
    keys: &[Option<&[u8]>],
    key_head: Option<&[u8]>,
    values: &[Option<&[u8]>],
    value_head: Option<&[u8]>,
    framed: bool,
) -> Parsed<Columns> {
    let rows = values.len();
    let keys: Vec<Option<&[u8]>> = keys
        .iter()
        .map(|k| k.map(|k| cut(k, key_head, framed)).transpose())
        .collect::<Parsed<_>>()?;
    let values: Vec<Option<&[u8]>> = values
        .iter()
        .map(|v| v.map(|v| cut(v, value_head, framed)).transpose())
        .collect::<Parsed<_>>()?;
    let bytes: usize = values.iter().flatten().map(|v| v.len()).sum();
    let key_bytes: usize = keys.iter().flatten().map(|k| k.len()).sum();
    let mut out = Columns {
        keys: Strings::new(rows, key_bytes),
        values: Strings::new(rows, bytes),
        ts_ms: Vec::with_capacity(rows),
        ts_valid: Vec::with_capacity(rows.div_ceil(8)),
        ts_nulls: 0,
        before: Strings::new(rows, 0),
        after: Strings::new(rows, bytes / 2),
        updated: Strings::new(rows, 0),
        removed: Lists {
            offsets: vec![0],
            valid: Vec::new(),
            nulls: 0,
            items: Strings::new(0, 0),
        },
        truncated: Strings::new(rows, 0),
        snapshot: Strings::new(rows, rows * 5),
        source: Strings::new(rows, bytes / 3),
    };
    let mut frame: Option<Frame<'_>> = None;
    for (row, (&key, &value)) in keys.iter().zip(&values).enumerate() {
        if key.is_some_and(|k| !k.is_ascii() && std::str::from_utf8(k).is_err()) {
            return Err(Fallback);
        }
        out.keys.push(key)?;
        let framed = match (value, frame.as_ref()) {
            (Some(v), Some(f)) => out.framed(v, f)?,
            _ => false,
        };
        out.values.push(value)?;
        if framed {
            continue;
        }
        // A value that is not an object has no payload members (the reader is given `{}` for it).
        let found = match value {
            Some(v) if v.first() == Some(&b'{') => payload(v, &mut out)?,
            _ => Payload::default(),
        };
        if value.is_some_and(|v| !found.ascii && std::str::from_utf8(v).is_err()) {
            return Err(Fallback);
        }
        out.push_ts(found.ts_ms.flatten());
        out.before.end(found.before == Some(true))?;
        out.after.end(found.after == Some(true))?;
        let update = found.update.flatten().unwrap_or_default();
        out.updated.end(update.updated == Some(true))?;
        out.removed.end(update.removed == Some(true))?;
        out.truncated.push(update.truncated.flatten())?;
        let source = found.source.flatten();
        out.snapshot.end(source.as_ref().is_some_and(|s| s.snapshot == Some(true)))?;
        out.source.push(source.map(|s| s.text))?;
        if let (Some(v), Some(after)) = (value, found.after_span) {
            frame = Some(Frame { payload: v, after, row });
        }
    }
    Ok(out)
}

/// The byte strings of a list whose items are bytes or None.
fn byte_items<'py>(list: &Bound<'py, PyList>) -> PyResult<Vec<Option<Bound<'py, PyBytes>>>> {
    list.iter()
        .map(|item| {
            if item.is_none() {
                Ok(None)
            } else {
                Ok(Some(item.downcast_into::<PyBytes>()?))
            }
        })
        .collect()
}

/// The landing columns of one topic's records from their key and value bytes (None: a tombstone),
/// each cut after its topic's schema part `key_head` / `value_head` when it starts with it: key,
/// value (the payload text), ts_ms, before, after, updatedFields, removedFields, truncatedArrays (its
/// raw JSON text), source.snapshot and source (its raw JSON text). Every buffer is a [`Buffer`]:
/// strings come as (offsets, data, validity, null count); ts_ms as (i64 values, validity, null
/// count); removedFields as (list offsets, validity, null count, item strings). None when a record
/// needs Arrow's JSON reader. With `framed`, the caller vouches that every key and value starts with
/// its head (the converter wrote them after the topic's schema part), which is then not compared: it
/// is most of a record's bytes. The walk runs without the GIL.
#[pyfunction]
#[pyo3(signature = (keys, key_head, values, value_head, framed=false))]
pub fn landing_columns<'py>(
    py: Python<'py>,
    keys: &Bound<'py, PyList>,
    key_head: Option<&[u8]>,
    values: &Bound<'py, PyList>,
    value_head: Option<&[u8]>,
    framed: bool,
) -> PyResult<Option<LandingOut<'py>>> {
    if keys.len() != values.len() {
        return Err(PyValueError::new_err(format!(
            "one key per value: {} keys and {} values",
            keys.len(),
            values.len()
        )));
    }
    let key_items = byte_items(keys)?;
    let value_items = byte_items(values)?;
    let key_bytes: Vec<Option<&[u8]>> = key_items.iter().map(|k| k.as_ref().map(|k| k.as_bytes())).collect();
    let value_bytes: Vec<Option<&[u8]>> = value_items.iter().map(|v| v.as_ref().map(|v| v.as_bytes())).collect();
    let walked = py.allow_threads(|| columns(&key_bytes, key_head, &value_bytes, value_head, framed));
    walked.ok().map(|out| out.into_py(py)).transpose()
}

/// Records `lo..hi` of bytes laid end to end, `ends` being each record's end offset (native-endian u64).
fn run_items<'a>(data: &'a [u8], ends: &[u8], lo: usize, hi: usize) -> PyResult<Vec<Option<&'a [u8]>>> {
    let ends: Vec<usize> = ends
        .chunks_exact(8)
        .map(|end| u64::from_ne_bytes(end.try_into().unwrap_or_default()) as usize)
        .collect();
    if hi > ends.len() || lo > hi {
        return Err(PyValueError::new_err(format!("records {lo}..{hi} of a run of {}", ends.len())));
    }
    (lo..hi)
        .map(|i| {
            let start = if i == 0 { 0 } else { ends[i - 1] };
            data.get(start..ends[i])
                .map(Some)
                .ok_or_else(|| PyValueError::new_err(format!("record {i} ends past its run's {} bytes", data.len())))
        })
        .collect()
}

/// `landing_columns` of the records `lo..hi` of a run (a snapshot chunk), read from its buffers: keys and
/// values end to end with their end offsets (native-endian u64), no Python object per record.
#[pyfunction]
#[pyo3(signature = (keys, key_ends, values, value_ends, lo, hi, key_head, value_head, framed=false))]
#[allow(clippy::too_many_arguments)]
pub fn run_landing_columns<'py>(
    py: Python<'py>,
    keys: &[u8],
    key_ends: &[u8],
    values: &[u8],
    value_ends: &[u8],
    lo: usize,
    hi: usize,
    key_head: Option<&[u8]>,
    value_head: Option<&[u8]>,
    framed: bool,
) -> PyResult<Option<LandingOut<'py>>> {
    let key_items = run_items(keys, key_ends, lo, hi)?;
    let value_items = run_items(values, value_ends, lo, hi)?;
    let walked = py.allow_threads(|| columns(&key_items, key_head, &value_items, value_head, framed));
    walked.ok().map(|out| out.into_py(py)).transpose()
}

/// The landing rows a converter writes as it writes one collection's change records
/// (`ChangeWriter.write_landing` into a [`ChangeColumns`]): the payload columns of `landing_columns` and the
/// rows' positions and operations, taken from the parts as they are written, while their bytes are still in
/// the processor's cache; no record is walked again.
struct ChangeRows {
    cols: Columns,
    seconds: Vec<i64>,
    increments: Vec<i64>,
    ordinals: Vec<i64>,
    position: Strings,
    op: Strings,
}

/// The most data bytes a chunk takes before the converter starts another: far below Arrow's 2 GiB of
/// a string column even after one more record of the largest size.
const CHUNK_BYTES: usize = 512 << 20;

/// The width of the digits of a position's text (`Position.to_str`): seconds, increment, ordinal.
const POSITION_WIDTHS: [usize; 3] = [13, 10, 6];

/// `number` in decimal, zero-padded to `width` as Python's `%0Nd` pads it (the sign first, counted in the width).
fn push_padded(out: &mut Vec<u8>, number: i64, width: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = number.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let sign = usize::from(number < 0);
    if sign == 1 {
        out.push(b'-');
    }
    let written = digits.len() - at;
    out.extend(std::iter::repeat_n(b'0', width.saturating_sub(written + sign)));
    out.extend_from_slice(&digits[at..]);
}

/// How large a chunk grew (rows; bytes of keys, values, before, after, updatedFields, source): the next chunk of its
/// collection is made that large at once, and a quarter more (batches of inserts and of updates differ by
/// about a fifth; a column outgrowing its vector doubled it), from the vectors dropped buffers left
/// ([`spare`]), instead of growing into fresh memory (a page fault per 4 KiB first written) batch after batch.
#[derive(Clone, Copy, Default)]
struct ChunkSizes([usize; 7]);

impl ChangeRows {
    fn new(sizes: ChunkSizes) -> Self {
        let [rows, keys, values, before, after, updated, source] = sizes.0.map(|size| size + size / 4);
        let strings = |bytes: usize| Strings::new(rows, bytes);
        ChangeRows {
            cols: Columns {
                keys: strings(keys),
                values: strings(values),
                ts_ms: Vec::with_capacity(rows),
                ts_valid: Vec::with_capacity(rows.div_ceil(8)),
                ts_nulls: 0,
                before: strings(before),
                after: strings(after),
                updated: strings(updated),
                removed: Lists { offsets: vec![0], valid: Vec::new(), nulls: 0, items: Strings::new(0, 0) },
                truncated: strings(0),
                snapshot: strings(rows * 5),
                source: strings(source),
            },
            seconds: Vec::with_capacity(rows),
            increments: Vec::with_capacity(rows),
            ordinals: Vec::with_capacity(rows),
            position: strings(rows * 31),
            op: strings(rows),
        }
    }

    fn sizes(&self) -> ChunkSizes {
        let c = &self.cols;
        ChunkSizes([self.seconds.len(), c.keys.data.len(), c.values.data.len(), c.before.data.len(), c.after.data.len(),
                    c.updated.data.len(), c.source.data.len()])
    }

    /// Ends the row with its position and operation (None: a tombstone).
    fn end(&mut self, position: [i64; 3], op: Option<&[u8]>) -> Parsed<()> {
        let [seconds, increment, ordinal] = position;
        self.seconds.push(seconds);
        self.increments.push(increment);
        self.ordinals.push(ordinal);
        for (i, (number, width)) in position.iter().zip(POSITION_WIDTHS).enumerate() {
            if i > 0 {
                self.position.data.push(b'.');
            }
            push_padded(&mut self.position.data, *number, width);
        }
        self.position.end(true)?;
        self.op.push(op)
    }
}

/// A chunk of one collection's landing rows as its converter writes its change records, for the Parquet
/// sink: each record carries its [`LandingRow`] (`Record.parts`), and the sink takes the rows of a batch in
/// one call (`take_rows`), as Arrow buffers, instead of a Python object and a walk per record. Rows are
/// appended until the first `take`, which freezes the chunk (its buffers are lent to Arrow from then on, and
/// may be taken again: records are shared, a tee may hold two Parquet sinks); its [`ChangeLanding`] then
/// starts another. A row that cannot be written (a part of a form only the walk or Arrow's reader decides)
/// breaks the chunk: `take` then gives None and the sink walks those records' bytes, which are the same.
#[pyclass(module = "mongocdc_native")]
pub struct ChangeColumns {
    collection: String,
    /// How large it grew, once frozen (see [`ChunkSizes`]).
    sizes: ChunkSizes,
    open: Option<Box<ChangeRows>>,
    frozen: Option<Py<PyAny>>,
    key_head: Option<usize>,
    value_head: Option<usize>,
    rows: usize,
    broken: bool,
}

impl ChangeColumns {
    /// The payload of a key or value: after the schema part of `head` bytes and before the closing brace
    /// (the converter wrote it so), as it is without schemas.
    fn payload(raw: &[u8], head: Option<usize>) -> Parsed<&[u8]> {
        match head {
            None => Ok(raw),
            Some(head) if raw.len() > head && raw.ends_with(b"}") => Ok(&raw[head..raw.len() - 1]),
            Some(_) => Err(Fallback),
        }
    }

    /// Appends a row written by `write` (which may leave it half written only by failing: the chunk is
    /// then broken); its number, or None.
    fn append(&mut self, write: impl FnOnce(&mut ChangeRows) -> Parsed<()>) -> Option<usize> {
        if self.broken {
            return None;
        }
        let rows = self.open.as_deref_mut()?;
        if write(rows).is_err() {
            self.broken = true;
            self.open = None;
            return None;
        }
        self.rows += 1;
        Some(self.rows - 1)
    }

    /// Appends a change record's row from the parts its writer wrote: the key and value, the `before` and
    /// `after` parts (JSON string literals or `null`), where `updateDescription` and `source` lie in the
    /// value, `ts_ms`, the position and the operation's letter. Its row, or None when the chunk cannot
    /// take it (frozen, or broken by it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_change(
        &mut self,
        key: &[u8],
        value: &[u8],
        before: &[u8],
        after: &[u8],
        update_span: (usize, usize),
        source_span: (usize, usize),
        ts_ms: i64,
        position: [i64; 3],
        op: &[u8],
    ) -> Option<usize> {
        let (key_head, value_head) = (self.key_head, self.value_head);
        self.append(|rows| {
            let out = &mut rows.cols;
            out.keys.push(Some(Self::payload(key, key_head)?))?;
            out.values.push(Some(Self::payload(value, value_head)?))?;
            out.push_ts(Some(ts_ms));
            for (part, column) in [(before, &mut out.before), (after, &mut out.after)] {
                let present = part != b"null";
                if present && !unescape_into(part, &mut column.data) {
                    return Err(Fallback);
                }
                column.end(present)?;
            }
            let ((u0, u1), (s0, s1)) = (update_span, source_span);
            if u1 > value.len() || s1 > value.len() || u0 > u1 || s0 > s1 {
                return Err(Fallback);
            }
            let mut json = Json { b: &value[..u1], i: u0, sources: 0, ops: 0, high: 0 };
            let update = json.nullable(|json| update(json, out))?.unwrap_or_default();
            if json.i != u1 {
                return Err(Fallback);
            }
            out.updated.end(update.updated == Some(true))?;
            out.removed.end(update.removed == Some(true))?;
            out.truncated.push(update.truncated.flatten())?;
            let text = &value[s0..s1];
            out.snapshot.push(snapshot_of(text)?)?;
            out.source.push(Some(text))?;
            rows.end(position, Some(op))
        })
    }
}

impl ChangeColumns {
    fn new(collection: String, key_head: Option<usize>, value_head: Option<usize>, sizes: ChunkSizes) -> Self {
        let open = Some(Box::new(ChangeRows::new(sizes)));
        ChangeColumns { collection, sizes, open, frozen: None, key_head, value_head, rows: 0, broken: false }
    }

    /// Whether the chunk takes more rows (not yet taken, not broken, not near Arrow's limit).
    fn open(&self) -> bool {
        self.open.as_ref().is_some_and(|rows| rows.cols.values.data.len() + rows.cols.after.data.len() < CHUNK_BYTES)
    }

    /// Appends the row of a tombstone (its key; every other payload column null, no operation).
    fn push_tombstone(&mut self, key: &[u8], position: [i64; 3]) -> Option<usize> {
        let key_head = self.key_head;
        self.append(|rows| {
            let out = &mut rows.cols;
            out.keys.push(Some(Self::payload(key, key_head)?))?;
            out.values.push(None)?;
            out.push_ts(None);
            for column in [&mut out.before, &mut out.after, &mut out.updated, &mut out.truncated, &mut out.snapshot, &mut out.source] {
                column.end(false)?;
            }
            out.removed.end(false)?;
            rows.end(position, None)
        })
    }

    /// Writes `value` over the value of the last row (a value completed after its writer wrote it: the
    /// transaction block); the other columns stay, as they lie before the block. A chunk taken in between
    /// (its rows lent to Arrow, that row's with the value unfinished) is broken: later takes walk instead.
    fn replace_value(&mut self, value: &[u8]) {
        let value_head = self.value_head;
        let Some(rows) = self.open.as_deref_mut().filter(|_| !self.broken && self.rows > 0) else {
            self.broken = true;
            self.open = None;
            return;
        };
        let values = &mut rows.cols.values;
        let start = values.offsets[values.offsets.len() - 2] as usize;
        values.data.truncate(start);
        let written = Self::payload(value, value_head).ok().and_then(|payload| {
            values.data.extend_from_slice(payload);
            i32::try_from(values.data.len()).ok()
        });
        match written {
            Some(end) => *values.offsets.last_mut().unwrap_or(&mut 0) = end,
            None => {
                self.broken = true;
                self.open = None;
            }
        }
    }

    /// Every row of the chunk, which is frozen from now on: (its row count, its collection, the payload
    /// columns as `landing_columns` gives them, (seconds, increments, ordinals) as i64 buffers, the
    /// position texts, the operations); the same objects at every call. None when the chunk is broken.
    fn take(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        if self.broken {
            return Ok(None);
        }
        if let Some(rows) = self.open.take() {
            self.sizes = rows.sizes();
            let ChangeRows { cols, seconds, increments, ordinals, position, op } = *rows;
            let numbers = (
                Buffer::new(py, Words::I64(seconds))?,
                Buffer::new(py, Words::I64(increments))?,
                Buffer::new(py, Words::I64(ordinals))?,
            );
            let taken = (self.rows, &self.collection, cols.into_py(py)?, numbers, position.into_py(py)?, op.into_py(py)?);
            self.frozen = Some(taken.into_pyobject(py)?.into_any().unbind());
        }
        Ok(self.frozen.as_ref().map(|taken| taken.clone_ref(py)))
    }
}

/// One collection's landing rows, chunk after chunk, as its compiled writer writes its change records
/// (`ChangeWriter.write_landing`): the chunk being written, replaced by a new one of the same size once the
/// sink took it. `collection` is ``db.coll``; `key_head`/`value_head` the lengths of the schema parts its
/// keys and values are written after (None: without schemas).
#[pyclass(module = "mongocdc_native")]
pub struct ChangeLanding {
    chunk: Py<ChangeColumns>,
}

impl ChangeLanding {
    /// The chunk to append to: the current one, or a new one when it was taken (or broken, or is full).
    fn chunk<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, ChangeColumns>> {
        let chunk = self.chunk.bind(py);
        if chunk.borrow().open() {
            return Ok(chunk.clone());
        }
        let fresh = {
            let old = chunk.borrow();
            ChangeColumns::new(old.collection.clone(), old.key_head, old.value_head, old.sizes)
        };
        self.chunk = Py::new(py, fresh)?;
        Ok(self.chunk.bind(py).clone())
    }

    /// Appends a change record's row (see `ChangeColumns::push_change`): its `LandingRow`, or None.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_change(
        &mut self,
        py: Python<'_>,
        key: &[u8],
        value: &[u8],
        before: &[u8],
        after: &[u8],
        spans: ((usize, usize), (usize, usize)),
        ts_ms: i64,
        position: [i64; 3],
        op: &[u8],
    ) -> PyResult<Option<LandingRow>> {
        let chunk = self.chunk(py)?;
        let row = chunk.borrow_mut().push_change(key, value, before, after, spans.0, spans.1, ts_ms, position, op);
        Ok(row.map(|row| LandingRow { chunk: chunk.unbind(), row }))
    }
}

#[pymethods]
impl ChangeLanding {
    #[new]
    #[pyo3(signature = (collection, key_head, value_head))]
    fn new(py: Python<'_>, collection: String, key_head: Option<usize>, value_head: Option<usize>) -> PyResult<Self> {
        let chunk = ChangeColumns::new(collection, key_head, value_head, ChunkSizes::default());
        Ok(ChangeLanding { chunk: Py::new(py, chunk)? })
    }

    /// Appends the row of a tombstone at its position (its key; every other payload column null, no
    /// operation): its `LandingRow`, or None when the chunk cannot take it.
    fn push_tombstone(&mut self, py: Python<'_>, key: &[u8], seconds: i64, increment: i64, ordinal: i64) -> PyResult<Option<LandingRow>> {
        let chunk = self.chunk(py)?;
        let row = chunk.borrow_mut().push_tombstone(key, [seconds, increment, ordinal]);
        Ok(row.map(|row| LandingRow { chunk: chunk.unbind(), row }))
    }

    /// Writes `value` over the value of the last row written (the transaction block written in).
    fn replace_value(&self, py: Python<'_>, value: &[u8]) {
        self.chunk.bind(py).borrow_mut().replace_value(value);
    }
}

/// A change record's landing row: the chunk its converter appended it to, and its number there. Not a tuple:
/// one is made per record, and a tuple is an object Python's garbage collector tracks (and runs for).
#[pyclass(frozen, module = "mongocdc_native")]
pub struct LandingRow {
    chunk: Py<ChangeColumns>,
    row: usize,
}

/// Runs of rows as `take_rows` gives them: (a chunk's `take`, first row, end row).
type Runs = Vec<(Py<PyAny>, usize, usize)>;

/// The landing rows of a batch of one topic's change records (each record's `LandingRow`) as runs of
/// consecutive rows of one chunk: (the chunk's `take`, first row, end row) each, in the records' order.
/// None when a record has no row (None) or a chunk is broken: the sink then walks the records' bytes.
#[pyfunction]
pub fn take_rows(py: Python<'_>, parts: &Bound<'_, PyList>) -> PyResult<Option<Runs>> {
    let mut runs: Vec<(Py<ChangeColumns>, usize, usize)> = Vec::new();
    for part in parts.iter() {
        let Ok(part) = part.downcast::<LandingRow>() else { return Ok(None) };
        let LandingRow { chunk, row } = part.get();
        match runs.last_mut() {
            Some((last, _, end)) if last.as_ptr() == chunk.as_ptr() && *end == *row => *end += 1,
            _ => runs.push((chunk.clone_ref(py), *row, row + 1)),
        }
    }
    let mut taken = Vec::with_capacity(runs.len());
    for (chunk, lo, hi) in runs {
        let Some(rows) = chunk.bind(py).borrow_mut().take(py)? else { return Ok(None) };
        taken.push((rows, lo, hi));
    }
    Ok(Some(taken))
}

/// The `snapshot` member of a `source` block the converter wrote (one flat object, its text taken as it
/// is): the marker's text, or None when the block has none; a marker written with an escape or a block
/// of another shape goes to the walk. A block holding a brace in a string (a transaction's `lsid`, the
/// session document's text) is landed, by the reader path that decides such blocks, as orjson writes it
/// again once parsed: it is taken as it is only where that gives back its bytes ([`reads_back_the_same`]).
fn snapshot_of(text: &[u8]) -> Parsed<Option<&[u8]>> {
    const NAME: &[u8] = b"\"snapshot\":";
    if text.len() < 2 || text[0] != b'{' || text[text.len() - 1] != b'}' {
        return Err(Fallback);
    }
    let inner = &text[1..text.len() - 1];
    if (inner.contains(&b'{') || inner.contains(&b'}')) && !reads_back_the_same(text) {
        return Err(Fallback);
    }
    let Some(at) = text.windows(NAME.len()).position(|w| w[0] == b'"' && w == NAME) else { return Ok(None) };
    if !matches!(text[at - 1], b'{' | b',') {
        return Err(Fallback); // inside a string
    }
    let rest = &text[at + NAME.len()..];
    let Some(quoted) = rest.strip_prefix(b"\"") else { return Err(Fallback) };
    let end = quoted.iter().position(|&c| c == b'"' || c == b'\\').ok_or(Fallback)?;
    if quoted[end] != b'"' {
        return Err(Fallback);
    }
    Ok(Some(&quoted[..end]))
}

/// Whether orjson, given `text` parsed, writes exactly `text` again: one flat object, compact, with
/// distinct member names, valid UTF-8, strings escaping only `"` and `\\` (orjson writes every other
/// character but the controls as it is) and numbers that are integers written as orjson writes them; true,
/// false and null. Anything else (a nested value, another escape, a fraction) is not vouched for.
fn reads_back_the_same(text: &[u8]) -> bool {
    if std::str::from_utf8(text).is_err() {
        return false;
    }
    // The end of the string starting at `at` (its opening quote), or None when it escapes otherwise.
    let string = |at: usize| -> Option<usize> {
        let mut i = at + 1;
        loop {
            match *text.get(i)? {
                b'"' => return Some(i + 1),
                b'\\' if matches!(text.get(i + 1), Some(b'"' | b'\\')) => i += 2,
                c if c < 0x20 || c == b'\\' => return None,
                _ => i += 1,
            }
        }
    };
    let mut names: Vec<&[u8]> = Vec::new();
    let mut i = 1;
    if text.get(i) == Some(&b'}') {
        return i + 1 == text.len();
    }
    loop {
        let Some(end) = text.get(i).filter(|&&c| c == b'"').and_then(|_| string(i)) else { return false };
        if names.contains(&&text[i..end]) || text.get(end) != Some(&b':') {
            return false;
        }
        names.push(&text[i..end]);
        i = end + 1;
        i = match text.get(i) {
            Some(b'"') => match string(i) {
                Some(end) => end,
                None => return false,
            },
            Some(b'-' | b'0'..=b'9') => {
                let negative = text[i] == b'-';
                let digits = &text[i + usize::from(negative)..];
                let count = digits.iter().take_while(|c| c.is_ascii_digit()).count();
                // orjson reads integers of 64 bits (signed, or unsigned when positive) and writes them without
                // leading zeros or a sign on zero.
                let magnitude = std::str::from_utf8(&digits[..count]).ok().and_then(|d| d.parse::<u128>().ok());
                let limit = if negative { 1u128 << 63 } else { u128::from(u64::MAX) };
                if count == 0 || (digits[0] == b'0' && (count > 1 || negative)) || magnitude.is_none_or(|m| m > limit) {
                    return false;
                }
                i + usize::from(negative) + count
            }
            _ => match [&b"true"[..], b"false", b"null"].into_iter().find(|word| text[i..].starts_with(word)) {
                Some(word) => i + word.len(),
                None => return false,
            },
        };
        match text.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => return i + 1 == text.len(),
            _ => return false,
        }
    }
}

/// The payload texts of records `lo..hi` of a run the converter wrote (see `Afters`): each key and value
/// cut after its schema part of `key_head` / `value_head` bytes and before its closing brace, as (key
/// strings, value strings); the converter vouches for the heads, so their bytes are not compared. None
/// when a record is too short to hold its head and brace (not a record the converter wrote so).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn run_payloads<'py>(
    py: Python<'py>,
    keys: &[u8],
    key_ends: &[u8],
    values: &[u8],
    value_ends: &[u8],
    lo: usize,
    hi: usize,
    key_head: usize,
    value_head: usize,
) -> PyResult<Option<(StringsOut<'py>, StringsOut<'py>)>> {
    let key_items = run_items(keys, key_ends, lo, hi)?;
    let value_items = run_items(values, value_ends, lo, hi)?;
    let cut = |items: &[Option<&[u8]>], head: usize| -> Parsed<Strings> {
        let bytes = items.iter().flatten().map(|item| item.len().saturating_sub(head + 1)).sum();
        let mut column = Strings::new(items.len(), bytes);
        for item in items.iter().flatten() {
            if item.len() <= head || item.last() != Some(&b'}') {
                return Err(Fallback);
            }
            column.push(Some(&item[head..item.len() - 1]))?;
        }
        Ok(column)
    };
    let cut = py.allow_threads(|| Ok::<_, Fallback>((cut(&key_items, key_head)?, cut(&value_items, value_head)?)));
    match cut {
        Ok((keys, values)) => Ok(Some((keys.into_py(py)?, values.into_py(py)?))),
        Err(Fallback) => Ok(None),
    }
}

/// The columns for Python, in `landing_columns`'s order.
type LandingOut<'py> = (
    StringsOut<'py>,
    StringsOut<'py>,
    (Bound<'py, Buffer>, Bound<'py, Buffer>, usize),
    StringsOut<'py>,
    StringsOut<'py>,
    StringsOut<'py>,
    (Bound<'py, Buffer>, Bound<'py, Buffer>, usize, StringsOut<'py>),
    StringsOut<'py>,
    StringsOut<'py>,
    StringsOut<'py>,
);

impl Columns {
    fn into_py(self, py: Python<'_>) -> PyResult<LandingOut<'_>> {
        Ok((
            self.keys.into_py(py)?,
            self.values.into_py(py)?,
            (Buffer::new(py, Words::I64(self.ts_ms))?, Buffer::new(py, Words::U8(self.ts_valid))?, self.ts_nulls),
            self.before.into_py(py)?,
            self.after.into_py(py)?,
            self.updated.into_py(py)?,
            (
                Buffer::new(py, Words::I32(self.removed.offsets))?,
                Buffer::new(py, Words::U8(self.removed.valid))?,
                self.removed.nulls,
                self.removed.items.into_py(py)?,
            ),
            self.truncated.into_py(py)?,
            self.snapshot.into_py(py)?,
            self.source.into_py(py)?,
        ))
    }
}
