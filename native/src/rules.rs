//! `field.exclude.list` and `field.renames` applied while a document is written from its BSON, as
//! `mongocdc_core.events.transforms.CollectionFields.document` applies them to the decoded document.
//!
//! Python hands over only rule sets whose result does not depend on the order the rules are
//! applied in (`CollectionFields.compiled_rules`); a rename onto a name the document already has
//! is left to the Python path here (a dict would merge the two).

use pyo3::prelude::*;

use std::borrow::Cow;

use crate::walk::{DocumentWriter, Placed, Rules};
use crate::{repeats, Unsupported, Written};

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
        writer.ruled(data, false, 0, NodeRules { node: &self.root, renamed_last: self.renamed_last }).map(drop)
    }
}

/// The rules of one level of a document: its node, and where renamed members go.
#[derive(Clone, Copy)]
struct NodeRules<'a> {
    node: &'a Node,
    /// Debezium 3.x's order: renamed members last, in the order of their rules.
    renamed_last: bool,
}

impl<'a> Rules<'a> for NodeRules<'a> {
    const RULED: bool = true;
    type Inside = NodeRules<'a>;

    fn any(self) -> bool {
        !self.node.names.is_empty()
    }

    fn place(self, name: &'a [u8]) -> Result<Option<Placed<'a, Self>>, Unsupported> {
        let inside = |node: &'a Node| Some(NodeRules { node, renamed_last: self.renamed_last });
        Ok(match self.node.rule(name) {
            None => Some(Placed { name: Cow::Borrowed(name), inside: None, last: None, checked: false }),
            Some(rule) if rule.exclude => None,
            Some(Rule { rename: Some((new_name, index)), inside: node, .. }) => Some(Placed {
                name: Cow::Borrowed(new_name),
                inside: inside(node),
                last: self.renamed_last.then_some(*index),
                checked: true,
            }),
            Some(rule) => Some(Placed { name: Cow::Borrowed(name), inside: inside(&rule.inside), last: None, checked: false }),
        })
    }

    /// A member renamed onto a name the document has (`written`: the new names): merged by a dict.
    fn clash(self, names: &[&[u8]], written: &mut [Cow<'a, [u8]>]) -> bool {
        written.iter().any(|new_name| names.contains(&new_name.as_ref()))
    }
}

/// The rules of `updatedFields`: its members' names are dotted paths (`FieldRules::path`).
#[derive(Clone, Copy)]
struct UpdatePaths<'a>(&'a FieldRules);

impl<'a> Rules<'a> for UpdatePaths<'a> {
    const RULED: bool = true;
    type Inside = NodeRules<'a>;

    fn any(self) -> bool {
        true
    }

    fn place(self, name: &'a [u8]) -> Result<Option<Placed<'a, NodeRules<'a>>>, Unsupported> {
        let renamed_last = self.0.renamed_last;
        Ok(self.0.path(name)?.map(|(path, node, renamed_by)| Placed {
            name: Cow::Owned(path),
            inside: Some(NodeRules { node, renamed_last }),
            last: renamed_by.filter(|_| renamed_last),
            checked: true,
        }))
    }

    /// Two paths made one (`written`: every path): merged by a dict.
    fn clash(self, _names: &[&[u8]], written: &mut [Cow<'a, [u8]>]) -> bool {
        repeats(written)
    }
}

static EMPTY: Node = Node { names: Vec::new() };

/// A dotted update path (`updatedFields`, `removedFields`, `truncatedArrays`) under the rules, as
/// `CollectionFields._path` maps it: None when excluded, else the new path, the rules inside its
/// value and the index of the rule that renamed it. Numeric segments are array indexes (skipped
/// when matching); a segment of non-ASCII characters and ASCII digits only is left to Python
/// (`str.isdigit` counts other digits too).
type UpdatePath<'a> = Option<(Vec<u8>, &'a Node, Option<usize>)>;

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
        writer.ruled(fields, false, 0, UpdatePaths(self))
    }
}
