//! `field.exclude.list` and `field.renames` applied while a document is written from its BSON, as
//! `mongocdc_core.events.transforms.CollectionFields.document` applies them to the decoded document.
//!
//! Python hands over only rule sets whose result does not depend on the order the rules are
//! applied in (`CollectionFields.compiled_rules`); a rename onto a name the document already has
//! is left to the Python path here (a dict would merge the two).

use pyo3::prelude::*;

use crate::walk::DocumentWriter;
use crate::{element_end, repeats, Unsupported, Written, MAX_DEPTH};

/// What the rules say about one member name at one level.
#[derive(Default)]
struct Rule {
    exclude: bool,
    /// The new name and the index of the rule that gives it (renamed fields are ordered by it).
    rename: Option<(Vec<u8>, usize)>,
    /// Rules inside the member's documents (and the documents of its arrays).
    inside: Node,
}

#[derive(Default)]
struct Node {
    names: Vec<(Vec<u8>, Rule)>,
}

impl Node {
    fn rule(&self, name: &[u8]) -> Option<&Rule> {
        self.names.iter().find(|(n, _)| n == name).map(|(_, rule)| rule)
    }
}

/// One collection's field rules as a tree of names.
#[pyclass(frozen, module = "mongocdc_native")]
pub(crate) struct FieldRules {
    root: Node,
    /// Debezium 3.x's order: a renamed field becomes the last of its document.
    renamed_last: bool,
}

#[pymethods]
impl FieldRules {
    /// `rules`: (field path, new name or None to exclude), in the order they apply.
    #[new]
    fn new(rules: Vec<(Vec<String>, Option<String>)>, renamed_last: bool) -> Self {
        let mut root = Node::default();
        for (index, (path, new_name)) in rules.into_iter().enumerate() {
            insert(&mut root, &path, new_name.map(|name| (name.into_bytes(), index)));
        }
        FieldRules { root, renamed_last }
    }
}

/// Adds one rule: `rename` None excludes the path.
fn insert(node: &mut Node, path: &[String], rename: Option<(Vec<u8>, usize)>) {
    let Some((first, rest)) = path.split_first() else { return };
    let at = match node.names.iter().position(|(n, _)| *n == first.as_bytes()) {
        Some(at) => at,
        None => {
            node.names.push((first.as_bytes().to_vec(), Rule::default()));
            node.names.len() - 1
        }
    };
    let rule = &mut node.names[at].1;
    if !rest.is_empty() {
        insert(&mut rule.inside, rest, rename);
    } else if rename.is_none() {
        rule.exclude = true;
    } else {
        rule.rename = rename;
    }
}

impl FieldRules {
    /// A whole document (`before`, `after`, a read) with the rules applied.
    pub(crate) fn document<W: DocumentWriter>(&self, writer: &mut W, data: &[u8]) -> Written {
        walk(writer, data, false, 0, &self.root, self.renamed_last)
    }
}

/// A member's value under the rules `inside` it (none: as it is).
fn member<W: DocumentWriter>(writer: &mut W, kind: u8, value: &[u8], depth: u32, inside: &Node, last: bool) -> Written {
    match kind {
        0x03 | 0x04 if !inside.names.is_empty() => walk(writer, value, kind == 0x04, depth + 1, inside, last),
        _ => writer.value(kind, value, depth),
    }
}

/// A renamed member written last (Debezium 3.x): its rule's index, new name, type, value and inner rules.
type Moved<'a> = (usize, &'a [u8], u8, &'a [u8], &'a Node);

/// One document or array with the rules of `node` (an array's documents get its array's rules).
fn walk<W: DocumentWriter>(writer: &mut W, data: &[u8], array: bool, depth: u32, node: &Node, last: bool) -> Written {
    if depth > MAX_DEPTH || data.len() < 5 || data[data.len() - 1] != 0 {
        return Err(Unsupported);
    }
    let end = data.len() - 1;
    let mut found: Vec<(&[u8], u8, &[u8])> = Vec::new();
    let mut at = 4;
    while at < end {
        let kind = data[at];
        let name_end = at + 1 + data[at + 1..end].iter().position(|&b| b == 0).ok_or(Unsupported)?;
        let name = &data[at + 1..name_end];
        let next = element_end(kind, data, name_end + 1, end).ok_or(Unsupported)?;
        found.push((name, kind, &data[name_end + 1..next]));
        at = next;
    }
    if at != end {
        return Err(Unsupported);
    }
    let separator = writer.separator(array);
    writer.out().push(if array { b'[' } else { b'{' });
    if array {
        for (i, (_, kind, value)) in found.iter().enumerate() {
            if i > 0 {
                writer.out().extend_from_slice(separator);
            }
            member(writer, *kind, value, depth, node, last)?;
        }
        writer.out().push(b']');
        return Ok(());
    }
    let mut names: Vec<&[u8]> = found.iter().map(|(name, _, _)| *name).collect();
    if repeats(&mut names) || (names.contains(&&b"$ref"[..]) && names.contains(&&b"$id"[..])) {
        return Err(Unsupported); // decoded as a dict (the last value wins) or a DBRef: the Python path's
    }
    let mut count = 0;
    let mut moved: Vec<Moved<'_>> = Vec::new();
    for (name, kind, value) in &found {
        let (name, inside): (&[u8], &Node) = match node.rule(name) {
            None => (name, &EMPTY),
            Some(rule) if rule.exclude => continue,
            Some(Rule { rename: Some((new_name, index)), inside, .. }) => {
                if names.contains(&new_name.as_slice()) {
                    return Err(Unsupported); // renamed onto a name the document has: merged by a dict
                }
                if last {
                    moved.push((*index, new_name, *kind, value, inside));
                    continue;
                }
                (new_name, inside)
            }
            Some(rule) => (name, &rule.inside),
        };
        if count > 0 {
            writer.out().extend_from_slice(separator);
        }
        count += 1;
        writer.name(name)?;
        member(writer, *kind, value, depth, inside, last)?;
    }
    moved.sort_by_key(|entry| entry.0);
    for (_, name, kind, value, inside) in moved {
        if count > 0 {
            writer.out().extend_from_slice(separator);
        }
        count += 1;
        writer.name(name)?;
        member(writer, kind, value, depth, inside, last)?;
    }
    writer.out().push(b'}');
    Ok(())
}

static EMPTY: Node = Node { names: Vec::new() };

/// A dotted update path (`updatedFields`, `removedFields`, `truncatedArrays`) under the rules, as
/// `CollectionFields._path` maps it: None when excluded, else the new path, the rules inside its
/// value and the index of the rule that renamed it. Numeric segments are array indexes (skipped
/// when matching); a segment of non-ASCII characters and ASCII digits only is left to Python
/// (`str.isdigit` counts other digits too).
type UpdatePath<'a> = Option<(Vec<u8>, &'a Node, Option<usize>)>;

/// An `updatedFields` member under the rules: its new path, type, value and the rules inside it.
type Updated<'a> = (Vec<u8>, u8, &'a [u8], &'a Node);

impl FieldRules {
    fn path(&self, dotted: &[u8]) -> Result<UpdatePath<'_>, Unsupported> {
        let mut node = Some(&self.root);
        let mut renamed_by = None;
        let mut out: Vec<u8> = Vec::with_capacity(dotted.len() + 8);
        for (i, segment) in dotted.split(|&b| b == b'.').enumerate() {
            if i > 0 {
                out.push(b'.');
            }
            let digits_only = segment.iter().all(|&b| b.is_ascii_digit() || b >= 0x80);
            if !segment.is_empty() && digits_only {
                if !segment.is_ascii() {
                    return Err(Unsupported);
                }
                out.extend_from_slice(segment);
                continue;
            }
            let rule = node.and_then(|n| n.rule(segment));
            match rule {
                None => {
                    node = None;
                    out.extend_from_slice(segment);
                }
                Some(rule) if rule.exclude => return Ok(None),
                Some(rule) => {
                    match &rule.rename {
                        Some((new_name, index)) => {
                            out.extend_from_slice(new_name);
                            renamed_by = Some(*index);
                        }
                        None => out.extend_from_slice(segment),
                    }
                    node = Some(&rule.inside);
                }
            }
        }
        Ok(Some((out, node.unwrap_or(&EMPTY), renamed_by)))
    }

    /// A `removedFields` or `truncatedArrays` path under the rules (None: excluded).
    pub(crate) fn field_path(&self, dotted: &[u8]) -> Result<Option<Vec<u8>>, Unsupported> {
        Ok(self.path(dotted)?.map(|(path, _, _)| path))
    }

    /// `updatedFields` (`fields`: the BSON document) under the rules, as
    /// `CollectionFields.updated_fields` makes it, written as a document into `writer`; returns how
    /// many members it kept.
    pub(crate) fn updated_fields<W: DocumentWriter>(&self, writer: &mut W, fields: &[u8]) -> Result<usize, Unsupported> {
        let members = crate::members(fields).ok_or(Unsupported)?;
        let mut names: Vec<&[u8]> = members.iter().map(|(name, _, _)| *name).collect();
        if repeats(&mut names) || (names.contains(&&b"$ref"[..]) && names.contains(&&b"$id"[..])) {
            return Err(Unsupported); // decoded as a dict (the last value wins) or a DBRef
        }
        let mut kept: Vec<Updated<'_>> = Vec::with_capacity(members.len());
        let mut moved: Vec<(usize, Updated<'_>)> = Vec::new();
        for (name, kind, value) in members {
            let Some((path, inside, renamed_by)) = self.path(name)? else { continue };
            match renamed_by {
                Some(index) if self.renamed_last => moved.push((index, (path, kind, value, inside))),
                _ => kept.push((path, kind, value, inside)),
            }
        }
        moved.sort_by_key(|entry| entry.0);
        kept.extend(moved.into_iter().map(|(_, entry)| entry));
        let mut written: Vec<&[u8]> = kept.iter().map(|(path, _, _, _)| path.as_slice()).collect();
        if repeats(&mut written) {
            return Err(Unsupported); // two paths made one: merged by a dict
        }
        let separator = writer.separator(false);
        writer.out().push(b'{');
        for (i, (path, kind, value, inside)) in kept.iter().enumerate() {
            if i > 0 {
                writer.out().extend_from_slice(separator);
            }
            writer.name(path)?;
            member(writer, *kind, value, 0, inside, self.renamed_last)?;
        }
        writer.out().push(b'}');
        Ok(kept.len())
    }
}
