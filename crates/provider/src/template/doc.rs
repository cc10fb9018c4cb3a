//! What `json(file)` answers: the parsed document as template values whose mappings and
//! sequences are [`Doc`]s. They read like minijinja's own (attributes, items, loops,
//! `tojson`), but comparing two of them charges every node it visits to the render's work
//! (`work.rs`), where minijinja would charge their top-level items only: `a == b` in a loop
//! over two large nested documents is then bounded like any other work.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use minijinja::Value;
use minijinja::value::{DynObject, Enumerator, Object, ObjectExt as _, ObjectRepr};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::work::compare_step;

/// A mapping or a sequence of a parsed document.
pub(crate) enum Doc {
    Map(BTreeMap<Value, Value>),
    Seq(Vec<Value>),
}

impl fmt::Debug for Doc {
    // Never the content: a document is a secret's.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Doc::Map(m) => write!(f, "Doc::Map({} keys)", m.len()),
            Doc::Seq(s) => write!(f, "Doc::Seq({} items)", s.len()),
        }
    }
}

impl Object for Doc {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        match **self {
            Doc::Map(_) => ObjectRepr::Map,
            Doc::Seq(_) => ObjectRepr::Seq,
        }
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match &**self {
            Doc::Map(map) => map.get(key).cloned(),
            Doc::Seq(seq) => seq.get(key.as_usize()?).cloned(),
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match &**self {
            Doc::Map(_) => self.mapped_enumerator(|this| match this {
                Doc::Map(map) => Box::new(map.keys().cloned()),
                Doc::Seq(_) => Box::new(std::iter::empty()),
            }),
            Doc::Seq(seq) => Enumerator::Seq(seq.len()),
        }
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(match &**self {
            Doc::Map(map) => map.len(),
            Doc::Seq(seq) => seq.len(),
        })
    }

    /// Equal when minijinja's own comparison would say so (same keys and values, same
    /// items), ordered as it orders them; each node visited is charged, and once the work
    /// is stopped the answer comes without looking (the render then fails).
    fn custom_cmp(self: &Arc<Self>, other: &DynObject) -> Option<Ordering> {
        let other = other.downcast_ref::<Doc>()?;
        Some(match (&**self, other) {
            (Doc::Map(a), Doc::Map(b)) => charged(a.iter(), b.iter()),
            (Doc::Seq(a), Doc::Seq(b)) => charged(a.iter(), b.iter()),
            (Doc::Map(_), Doc::Seq(_)) => Ordering::Greater,
            (Doc::Seq(_), Doc::Map(_)) => Ordering::Less,
        })
    }
}

/// Compares two sequences item by item (a nested document compares, and is charged, in
/// its own `custom_cmp`), charging each item.
fn charged<T: Ord>(
    mut a: impl ExactSizeIterator<Item = T>,
    mut b: impl ExactSizeIterator<Item = T>,
) -> Ordering {
    let lengths = a.len().cmp(&b.len());
    loop {
        match (a.next(), b.next()) {
            (Some(x), Some(y)) => {
                if !compare_step() {
                    return Ordering::Less;
                }
                match x.cmp(&y) {
                    Ordering::Equal => {}
                    unequal => return unequal,
                }
            }
            _ => return lengths,
        }
    }
}

/// A parsed document as a template value (see the module's documentation).
pub(crate) struct Parsed(pub(crate) Value);

impl<'de> Deserialize<'de> for Parsed {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DocVisitor)
    }
}

struct DocVisitor;

impl<'de> Visitor<'de> for DocVisitor {
    type Value = Parsed;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON or YAML value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Parsed, E> {
        Ok(Parsed(Value::from(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Parsed, E> {
        Ok(Parsed(Value::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Parsed, E> {
        Ok(Parsed(Value::from(v)))
    }

    fn visit_i128<E>(self, v: i128) -> Result<Parsed, E> {
        Ok(Parsed(Value::from(v)))
    }

    fn visit_u128<E>(self, v: u128) -> Result<Parsed, E> {
        Ok(Parsed(Value::from(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Parsed, E> {
        Ok(Parsed(Value::from(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Parsed, E> {
        Ok(Parsed(Value::from(v)))
    }

    fn visit_string<E>(self, v: String) -> Result<Parsed, E> {
        Ok(Parsed(Value::from(v)))
    }

    fn visit_bytes<E>(self, v: &[u8]) -> Result<Parsed, E> {
        Ok(Parsed(Value::from_bytes(v.to_vec())))
    }

    fn visit_unit<E>(self) -> Result<Parsed, E> {
        Ok(Parsed(Value::from(())))
    }

    fn visit_none<E>(self) -> Result<Parsed, E> {
        Ok(Parsed(Value::from(())))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Parsed, D::Error> {
        Parsed::deserialize(d)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Parsed, D::Error> {
        Parsed::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Parsed, A::Error> {
        let mut items = Vec::new();
        while let Some(Parsed(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Parsed(Value::from_object(Doc::Seq(items))))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Parsed, A::Error> {
        let mut entries = BTreeMap::new();
        while let Some((Parsed(key), Parsed(value))) = map.next_entry()? {
            entries.insert(key, value);
        }
        Ok(Parsed(Value::from_object(Doc::Map(entries))))
    }
}

#[cfg(test)]
mod tests {
    use super::super::work::{Charging, Stop, Work};
    use super::*;

    fn parse(json: &str) -> Value {
        crate::extract::parse_as::<Parsed>(json.as_bytes(), None)
            .expect("json")
            .0
    }

    #[test]
    fn documents_compare_as_minijinjas_values_do() {
        let a = parse(r#"{"k": [1, {"x": "y"}], "n": null}"#);
        let same = parse(r#"{"n": null, "k": [1, {"x": "y"}]}"#);
        let other = parse(r#"{"k": [1, {"x": "z"}], "n": null}"#);
        assert_eq!(a, same);
        assert_ne!(a, other);
        assert!(a < other);
        let native: Value =
            crate::extract::parse_as(br#"{"k": [1, {"x": "y"}], "n": null}"#, None).expect("json");
        assert_eq!(a, native, "a document equals minijinja's value of it");
        assert_eq!(a.get_attr("k").unwrap().len(), Some(2));
        assert_eq!(format!("{:?}", a.as_object().unwrap()), "Doc::Map(2 keys)");
    }

    #[test]
    fn a_deep_comparison_is_charged_every_node_and_stops_at_the_fuel() {
        // Two documents of one top-level key over 2000 nested items each: minijinja charges
        // one item, this charges them all.
        let items = (0..2000)
            .map(|i| format!("[{i}]"))
            .collect::<Vec<_>>()
            .join(",");
        let a = parse(&format!(r#"{{"k": [{items}]}}"#));
        let b = parse(&format!(r#"{{"k": [{items}]}}"#));
        let work = Work::new(1_000_000, None);
        work.start_render();
        {
            let _charging = Charging::to(&work);
            assert_eq!(a, b);
        }
        work.end_render(0);
        let spent = 1_000_000 - work.fuel_left();
        assert!((4001..=4100).contains(&spent), "{spent}");

        let poor = Work::new(100, None);
        poor.start_render();
        let _charging = Charging::to(&poor);
        let _ = a == b;
        assert_eq!(poor.stopped(), Some(Stop::OutOfWork));
    }
}
