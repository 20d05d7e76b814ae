//! The one walk of a BSON document into text, generic over the text's spelling: each format's writer
//! (`Writer<S: Style>` of the default and 1.x formats, `java::JavaWriter` of Debezium 3.x's) says how
//! it spells names, separators and each scalar type, and the walk does the rest: the framing checks,
//! nesting, which scalar type is which, what goes to the Python path (repeated names, DBRefs,
//! documents nested too deep) and, with the collection's field rules (`rules`), which members are
//! left out, renamed or written last. Each writer gets its own compiled walk, and the walk without
//! rules its own (no call through a pointer per value, no rule looked up).

use std::borrow::Cow;

use crate::{element_end, le_i32, le_i64, push_int, repeats, Member, Unsupported, Written, MAX_DEPTH};

/// The elements of a BSON document or array in order, each as (name, type, value bytes as `element_end`
/// cuts them); an element that does not frame is an Err, and the last item.
pub(crate) struct Elements<'a> {
    data: &'a [u8],
    at: usize,
    end: usize,
}

impl<'a> Elements<'a> {
    /// None when `data` is not framed as a document (its length, then its elements, then a NUL).
    #[inline]
    pub(crate) fn of(data: &'a [u8]) -> Option<Self> {
        if data.len() < 5 || data[data.len() - 1] != 0 {
            return None;
        }
        Some(Elements { data, at: 4, end: data.len() - 1 })
    }
}

impl<'a> Iterator for Elements<'a> {
    type Item = Result<Member<'a>, Unsupported>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let (data, at, end) = (self.data, self.at, self.end);
        if at >= end {
            return None;
        }
        let kind = data[at];
        let cut = data[at + 1..end].iter().position(|&b| b == 0).and_then(|length| {
            let name_end = at + 1 + length;
            Some((name_end, element_end(kind, data, name_end + 1, end)?))
        });
        let Some((name_end, next)) = cut else {
            self.at = end;
            return Some(Err(Unsupported));
        };
        self.at = next;
        Some(Ok((&data[at + 1..name_end], kind, &data[name_end + 1..next])))
    }
}

/// The type and value of `document`'s first member `name`; None when it has none, or does not frame
/// up to it.
pub(crate) fn first_member<'a>(document: &'a [u8], name: &[u8]) -> Option<(u8, &'a [u8])> {
    for element in Elements::of(document)? {
        let (found, kind, value) = element.ok()?;
        if found == name {
            return Some((kind, value));
        }
    }
    None
}

/// A string element's text (`value` as `element_end` cuts it: its length, its bytes, a NUL), the same in
/// every format; None when it is not framed so.
#[inline]
pub(crate) fn string_text(value: &[u8]) -> Option<&[u8]> {
    if value.len() < 5 || value[value.len() - 1] != 0 {
        return None;
    }
    Some(&value[4..value.len() - 1])
}

/// Where a member goes under field rules: its name as written, the rules inside its value (None: none),
/// for a member written after the others (Debezium 3.x's renamed fields) its place among them, and
/// whether its name is one `Rules::clash` checks.
pub(crate) struct Placed<'a, R> {
    pub(crate) name: Cow<'a, [u8]>,
    pub(crate) inside: Option<R>,
    pub(crate) last: Option<usize>,
    pub(crate) checked: bool,
}

/// Field rules at one level of a document: what each member becomes.
pub(crate) trait Rules<'a>: Copy {
    /// Whether any rule applies (false: the walk without rules, which keeps nothing for them).
    const RULED: bool;
    /// The rules of the members' values.
    type Inside: Rules<'a>;
    /// Whether a rule applies at this level or below.
    fn any(self) -> bool;
    /// Where member `name` goes; None when it is left out.
    fn place(self, name: &'a [u8]) -> Result<Option<Placed<'a, Self::Inside>>, Unsupported>;
    /// Whether the checked names as written (`written`, reordered here) are not what a dict would make of
    /// the document's own (`names`): the Python path's then.
    fn clash(self, names: &[&[u8]], written: &mut [Cow<'a, [u8]>]) -> bool;
}

/// No rules: every member as it is.
#[derive(Clone, Copy)]
pub(crate) struct Unruled;

impl<'a> Rules<'a> for Unruled {
    const RULED: bool = false;
    type Inside = Unruled;

    #[inline]
    fn any(self) -> bool {
        false
    }

    #[inline]
    fn place(self, name: &'a [u8]) -> Result<Option<Placed<'a, Unruled>>, Unsupported> {
        Ok(Some(Placed { name: Cow::Borrowed(name), inside: None, last: None, checked: false }))
    }

    #[inline]
    fn clash(self, _names: &[&[u8]], _written: &mut [Cow<'a, [u8]>]) -> bool {
        false
    }
}

/// A member written after the others: its place among them, name as written, type, value, inner rules and
/// whether its name is checked.
type Last<'a, R> = (usize, Cow<'a, [u8]>, u8, &'a [u8], Option<R>, bool);

/// A writer of one text format.
pub(crate) trait DocumentWriter: Sized {
    fn out(&mut self) -> &mut Vec<u8>;
    /// Between members (`array`: between elements).
    fn separator(&self, array: bool) -> &'static [u8];
    /// A member's name and what follows it before the value.
    fn name(&mut self, name: &[u8]) -> Written;

    // One method per scalar type, in the format's spelling; Err for a value the format leaves to Python.
    fn double(&mut self, value: f64) -> Written;
    fn string(&mut self, text: &[u8]) -> Written;
    fn binary(&mut self, subtype: u8, data: &[u8]) -> Written;
    fn object_id(&mut self, id: &[u8]);
    fn date(&mut self, millis: i64);
    fn int64(&mut self, value: i64);
    fn decimal128(&mut self, bid: &[u8]) -> Written;
    fn timestamp(&mut self, time: u32, increment: u32) -> Written;
    /// MaxKey (`max`) or MinKey.
    fn key_bound(&mut self, max: bool) -> Written;

    /// One value of type `kind` other than a document or an array (`value`: its bytes, as
    /// `element_end` cuts them); Err for a type the format leaves to Python.
    #[inline]
    fn scalar(&mut self, kind: u8, value: &[u8]) -> Written {
        match kind {
            0x01 => self.double(f64::from_bits(le_i64(value, 0).ok_or(Unsupported)? as u64))?,
            0x02 => self.string(string_text(value).ok_or(Unsupported)?)?,
            0x05 => self.binary(*value.get(4).ok_or(Unsupported)?, &value[5..])?,
            0x07 => self.object_id(value),
            0x08 => match value {
                [0] => self.out().extend_from_slice(b"false"),
                [1] => self.out().extend_from_slice(b"true"),
                _ => return Err(Unsupported),
            },
            0x09 => self.date(le_i64(value, 0).ok_or(Unsupported)?),
            0x0a => self.out().extend_from_slice(b"null"),
            0x10 => push_int(self.out(), i64::from(le_i32(value, 0).ok_or(Unsupported)?)),
            0x11 => self.timestamp(le_i32(value, 4).ok_or(Unsupported)? as u32, le_i32(value, 0).ok_or(Unsupported)? as u32)?,
            0x12 => self.int64(le_i64(value, 0).ok_or(Unsupported)?),
            0x13 => self.decimal128(value)?,
            0x7f => self.key_bound(true)?,
            0xff => self.key_bound(false)?,
            _ => return Err(Unsupported),
        }
        Ok(())
    }

    /// One value of type `kind` (`value`: its bytes, as `element_end` cuts them), without rules.
    fn value(&mut self, kind: u8, value: &[u8], depth: u32) -> Written {
        match kind {
            0x03 | 0x04 => self.document(value, kind == 0x04, depth + 1),
            _ => self.scalar(kind, value),
        }
    }

    /// One BSON document or array (`data` from its length to its terminating NUL), without rules.
    fn document(&mut self, data: &[u8], array: bool, depth: u32) -> Written {
        self.ruled(data, array, depth, Unruled).map(drop)
    }

    /// A value under the rules `inside` it (none, or none that apply: as it is).
    fn ruled_value<'a, R: Rules<'a>>(&mut self, kind: u8, value: &'a [u8], depth: u32, inside: Option<R>) -> Written {
        match (kind, inside) {
            (0x03 | 0x04, Some(inside)) if inside.any() => self.ruled(value, kind == 0x04, depth + 1, inside).map(drop),
            _ => self.value(kind, value, depth),
        }
    }

    /// One BSON document or array under `rules` (an array's documents get its array's rules); how many
    /// members it wrote.
    fn ruled<'a, R: Rules<'a>>(&mut self, data: &'a [u8], array: bool, depth: u32, rules: R) -> Result<usize, Unsupported> {
        if depth > MAX_DEPTH {
            return Err(Unsupported);
        }
        let elements = Elements::of(data).ok_or(Unsupported)?;
        let separator = self.separator(array);
        let mut names: Vec<&[u8]> = Vec::new();
        let mut written: Vec<Cow<'a, [u8]>> = Vec::new();
        let mut last: Vec<Last<'a, R::Inside>> = Vec::new();
        let mut count = 0usize;
        self.out().push(if array { b'[' } else { b'{' });
        for element in elements {
            let (name, kind, value) = element?;
            if array {
                if count > 0 {
                    self.out().extend_from_slice(separator);
                }
                count += 1;
                self.ruled_value(kind, value, depth, Some(rules))?;
                continue;
            }
            names.push(name);
            let Some(placed) = rules.place(name)? else { continue };
            if let Some(place) = placed.last {
                last.push((place, placed.name, kind, value, placed.inside, placed.checked));
                continue;
            }
            if count > 0 {
                self.out().extend_from_slice(separator);
            }
            count += 1;
            self.name(&placed.name)?;
            self.ruled_value(kind, value, depth, placed.inside)?;
            if R::RULED && placed.checked {
                written.push(placed.name);
            }
        }
        last.sort_by_key(|entry| entry.0);
        for (_, name, kind, value, inside, checked) in last {
            if count > 0 {
                self.out().extend_from_slice(separator);
            }
            count += 1;
            self.name(&name)?;
            self.ruled_value(kind, value, depth, inside)?;
            if checked {
                written.push(name);
            }
        }
        if R::RULED && rules.clash(&names, &mut written) {
            return Err(Unsupported);
        }
        if repeats(&mut names) {
            return Err(Unsupported); // a repeated name: decoded as a dict, its last value would win
        }
        if names.contains(&&b"$ref"[..]) && names.contains(&&b"$id"[..]) {
            return Err(Unsupported); // decoded as a DBRef, written back as $ref, $id, $db, then the rest
        }
        self.out().push(if array { b']' } else { b'}' });
        Ok(count)
    }
}

/// The key's `id`: the value of `document`'s first `_id` as `writer` writes it, as a JSON string; Err
/// when it has none (the Python path names it) or `written` leaves its type to the Python path.
pub(crate) fn key_id<W: DocumentWriter>(writer: &mut W, document: &[u8], written: impl Fn(u8) -> bool) -> Written {
    let (kind, value) = first_member(document, b"_id").filter(|(kind, _)| written(*kind)).ok_or(Unsupported)?;
    writer.out().push(b'"');
    writer.value(kind, value, 0)?;
    writer.out().push(b'"');
    Ok(())
}
