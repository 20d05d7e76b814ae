//! `field.exclude.list` and `field.renames` applied while a document is written from its BSON, as
//! `mongocdc_core.events.transforms.CollectionFields.document` applies them to the decoded document.
//!
//! Python hands over only rule sets whose result does not depend on the order the rules are
//! applied in (`CollectionFields.compiled_rules`); a rename onto a name the document already has
//! is left to the Python path here (a dict would merge the two).

use pyo3::prelude::*;

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

/// A writer of one text format, as the rules walk needs it.
pub(crate) trait DocumentWriter {
    fn out(&mut self) -> &mut Vec<u8>;
    /// Between members (`array`: between elements).
    fn separator(&self, array: bool) -> &'static [u8];
    /// A member's name and what follows it before the value.
    fn name(&mut self, name: &[u8]) -> Written;
    /// One value of type `kind` (`value`: its bytes, as `members` cuts them), without rules.
    fn value(&mut self, kind: u8, value: &[u8], depth: u32) -> Written;
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
