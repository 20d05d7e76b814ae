//! The one walk of a BSON document into text, generic over the text's spelling: each format's writer
//! (`Writer<S: Style>` of the default and 1.x formats, `java::JavaWriter` of Debezium 3.x's) says how
//! it spells names, separators and scalar values, and the walk (and the field rules' walk, `rules`)
//! does the rest: the framing checks, nesting, and what goes to the Python path (repeated names,
//! DBRefs, documents nested too deep). Each writer gets its own compiled walk (no call through a
//! pointer per value).

use crate::{element_end, repeats, Unsupported, Written, MAX_DEPTH};

/// A string element's text (`value` as `element_end` cuts it: its length, its bytes, a NUL), the same in
/// every format; None when it is not framed so.
#[inline]
pub(crate) fn string_text(value: &[u8]) -> Option<&[u8]> {
    if value.len() < 5 || value[value.len() - 1] != 0 {
        return None;
    }
    Some(&value[4..value.len() - 1])
}

/// A writer of one text format.
pub(crate) trait DocumentWriter: Sized {
    fn out(&mut self) -> &mut Vec<u8>;
    /// Between members (`array`: between elements).
    fn separator(&self, array: bool) -> &'static [u8];
    /// A member's name and what follows it before the value.
    fn name(&mut self, name: &[u8]) -> Written;
    /// One value of type `kind` other than a document or an array (`value`: its bytes, as
    /// `element_end` cuts them); Err for a type the format leaves to Python.
    fn scalar(&mut self, kind: u8, value: &[u8]) -> Written;

    /// One value of type `kind` (`value`: its bytes, as `element_end` cuts them), without rules.
    fn value(&mut self, kind: u8, value: &[u8], depth: u32) -> Written {
        match kind {
            0x03 | 0x04 => self.document(value, kind == 0x04, depth + 1),
            _ => self.scalar(kind, value),
        }
    }

    /// One BSON document or array (`data` from its length to its terminating NUL), without rules.
    fn document(&mut self, data: &[u8], array: bool, depth: u32) -> Written {
        if depth > MAX_DEPTH || data.len() < 5 || data[data.len() - 1] != 0 {
            return Err(Unsupported);
        }
        let end = data.len() - 1;
        let separator = self.separator(array);
        let mut names: Vec<&[u8]> = Vec::new();
        let mut count = 0usize;
        self.out().push(if array { b'[' } else { b'{' });
        let mut at = 4;
        while at < end {
            let kind = data[at];
            let name_end = at + 1 + data[at + 1..end].iter().position(|&b| b == 0).ok_or(Unsupported)?;
            let name = &data[at + 1..name_end];
            at = name_end + 1;
            if count > 0 {
                self.out().extend_from_slice(separator);
            }
            count += 1;
            if !array {
                names.push(name);
                self.name(name)?;
            }
            let next = element_end(kind, data, at, end).ok_or(Unsupported)?;
            self.value(kind, &data[at..next], depth)?;
            at = next;
        }
        if at != end || repeats(&mut names) {
            return Err(Unsupported); // a repeated name: decoded as a dict, its last value would win
        }
        if names.contains(&&b"$ref"[..]) && names.contains(&&b"$id"[..]) {
            return Err(Unsupported); // decoded as a DBRef, written back as $ref, $id, $db, then the rest
        }
        self.out().push(if array { b']' } else { b'}' });
        Ok(())
    }
}
