//! Hostile documents: the shapes that make a parser allocate more than it reads. Each
//! generator keeps its output under a size, so the bound is tested at every size.

use proptest::prelude::*;

/// One family of hostile YAML (or JSON, a subset of YAML) text.
#[derive(Clone, Debug)]
pub enum Shape {
    /// Nested anchors: each level a list of the previous one `fanout` times.
    Laughs {
        levels: usize,
        fanout: usize,
        leaf: usize,
    },
    /// One long scalar anchored once, aliased as keys and as values.
    AliasedScalar { scalar: usize, uses: usize },
    /// Merge keys pulling one anchored mapping into many.
    Merges { keys: usize, maps: usize },
    /// Nesting `depth` deep, in flow or block style.
    Deep { depth: usize, flow: bool },
    /// A mapping of `keys` short keys.
    ManyKeys { keys: usize, json: bool },
    /// A flow sequence of `items` one-character items.
    ManyItems { items: usize, json: bool },
    /// Long scalars.
    LongScalars {
        count: usize,
        len: usize,
        json: bool,
    },
    /// A JSON object nested `depth` deep with `width` members per level.
    JsonTree { depth: usize, width: usize },
}

impl Shape {
    /// The document, at most about `max` bytes.
    pub fn render(&self, max: usize) -> String {
        let mut out = String::new();
        match *self {
            Shape::Laughs {
                levels,
                fanout,
                leaf,
            } => {
                out.push_str(&format!(
                    "l0: &l0 [{}]\n",
                    vec!["lol"; leaf.max(1)].join(", ")
                ));
                for level in 1..=levels {
                    let items = vec![format!("*l{}", level - 1); fanout.max(1)].join(", ");
                    out.push_str(&format!("l{level}: &l{level} [{items}]\n"));
                }
            }
            Shape::AliasedScalar { scalar, uses } => {
                out.push_str(&format!("a: &s {}\n", "x".repeat(scalar.max(1))));
                for i in 0..uses {
                    out.push_str(&format!("k{i}: *s\n"));
                    if i % 3 == 0 {
                        out.push_str(&format!("? *s\n: v{i}\n"));
                    }
                }
            }
            Shape::Merges { keys, maps } => {
                out.push_str("base: &b {");
                let members: Vec<String> =
                    (0..keys.max(1)).map(|k| format!("m{k}: v{k}")).collect();
                out.push_str(&members.join(", "));
                out.push_str("}\n");
                for m in 0..maps {
                    out.push_str(&format!("d{m}: {{<<: *b, own: {m}}}\n"));
                }
            }
            Shape::Deep { depth, flow } => {
                if flow {
                    out.push_str(&"[".repeat(depth));
                    out.push_str(&"]".repeat(depth));
                } else {
                    for d in 0..depth {
                        out.push_str(&" ".repeat(d));
                        out.push_str("a:\n");
                    }
                }
            }
            Shape::ManyKeys { keys, json } => {
                if json {
                    let members: Vec<String> = (0..keys).map(|k| format!("\"{k}\":1")).collect();
                    out = format!("{{{}}}", members.join(","));
                } else {
                    for k in 0..keys {
                        out.push_str(&format!("{k}: 1\n"));
                    }
                }
            }
            Shape::ManyItems { items, json } => {
                let sep = if json { "," } else { ", " };
                out = format!("[{}]", vec!["1"; items].join(sep));
            }
            Shape::LongScalars { count, len, json } => {
                let members: Vec<String> = (0..count)
                    .map(|i| format!("\"k{i}\": \"{}\"", "y".repeat(len)))
                    .collect();
                out = if json {
                    format!("{{{}}}", members.join(","))
                } else {
                    members.join("\n")
                };
            }
            Shape::JsonTree { depth, width } => {
                fn tree(depth: usize, width: usize) -> String {
                    if depth == 0 {
                        return "0".into();
                    }
                    let inner = tree(depth - 1, width);
                    let members: Vec<String> =
                        (0..width).map(|w| format!("\"{w}\":{inner}")).collect();
                    format!("{{{}}}", members.join(","))
                }
                out = tree(depth, width.max(1));
            }
        }
        out.truncate(floor_char_boundary(&out, max));
        out
    }
}

fn floor_char_boundary(s: &str, max: usize) -> usize {
    let mut at = max.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// Any hostile shape, small or large.
pub fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        (1..9usize, 2..12usize, 1..40usize).prop_map(|(levels, fanout, leaf)| Shape::Laughs {
            levels,
            fanout,
            leaf
        }),
        (1..20_000usize, 1..2_000usize)
            .prop_map(|(scalar, uses)| Shape::AliasedScalar { scalar, uses }),
        (1..200usize, 1..2_000usize).prop_map(|(keys, maps)| Shape::Merges { keys, maps }),
        (1..300usize, any::<bool>()).prop_map(|(depth, flow)| Shape::Deep { depth, flow }),
        (1..20_000usize, any::<bool>()).prop_map(|(keys, json)| Shape::ManyKeys { keys, json }),
        (1..60_000usize, any::<bool>()).prop_map(|(items, json)| Shape::ManyItems { items, json }),
        (1..200usize, 1..2_000usize, any::<bool>())
            .prop_map(|(count, len, json)| Shape::LongScalars { count, len, json }),
        (1..8usize, 1..8usize).prop_map(|(depth, width)| Shape::JsonTree { depth, width }),
    ]
}

/// A `secrets` parameter whose entries alias, nest and repeat: entry-shaped, so the parse
/// goes past the list's first item.
#[derive(Clone, Debug)]
pub struct HostileList {
    pub entries: usize,
    pub scalar: usize,
    pub aliases_per_entry: usize,
    pub keys_per_entry: usize,
    pub nested: bool,
}

impl HostileList {
    pub fn render(&self, max: usize) -> String {
        let fields = [
            "fileName",
            "vaultId",
            "stage",
            "encoding",
            "format",
            "versionName",
            "failoverVaultId",
            "directory",
            "chainFileName",
        ];
        let mut out = format!("- name: &s {}\n", "n".repeat(self.scalar.max(1)));
        if self.nested {
            out.push_str("  keys: &k [{key: &kk a}, {key: *kk}, {key: *kk}]\n");
        }
        for e in 1..self.entries {
            out.push_str(&format!("- name: e{e}\n"));
            for field in fields.iter().take(self.aliases_per_entry) {
                out.push_str(&format!("  {field}: *s\n"));
            }
            if self.nested {
                out.push_str("  keys: *k\n");
            } else if self.keys_per_entry > 0 {
                let keys: Vec<String> = (0..self.keys_per_entry)
                    .map(|k| format!("{{key: *s, fileName: f{e}-{k}}}"))
                    .collect();
                out.push_str(&format!("  keys: [{}]\n", keys.join(", ")));
            }
        }
        out.truncate(floor_char_boundary(&out, max));
        out
    }
}

pub fn hostile_list() -> impl Strategy<Value = HostileList> {
    (
        1..300usize,
        1..1100usize,
        0..10usize,
        0..6usize,
        any::<bool>(),
    )
        .prop_map(
            |(entries, scalar, aliases_per_entry, keys_per_entry, nested)| HostileList {
                entries,
                scalar,
                aliases_per_entry,
                keys_per_entry,
                nested,
            },
        )
}

/// Hostile templates over the files `doc` (a hostile document), `same` (its copy) and
/// `list` (a long list): nesting at the bound and past it, documents compared deep in
/// loops, loops in loops, filter chains, `json` reads in loops. Each is at most the 16 KiB a
/// template may be.
pub fn template() -> impl Strategy<Value = String> {
    let nested = (1..60usize, 0..6usize).prop_map(|(depth, shape)| {
        let (open, core, close) = [
            ("- ", "1", ""),
            ("not ", "true", ""),
            ("", "text('doc')", " | trim"),
            ("(", "json('doc')", ")"),
            ("{% if true %}", "{{ text('doc') | length }}", "{% endif %}"),
            ("{% for x in json('list') %}", "{{ x }}", "{% endfor %}"),
        ][shape];
        let body = format!("{}{core}{}", open.repeat(depth), close.repeat(depth));
        if shape < 4 {
            format!("{{{{ {body} }}}}")
        } else {
            body
        }
    });
    let compares = (1..4usize).prop_map(|loops| {
        let open = "{% for i in json('list') %}".repeat(loops);
        let close = "{% endfor %}".repeat(loops);
        format!(
            "{open}{{% if json('doc') == json('same') or json('doc') in json('list') %}}.{{% endif %}}{close}"
        )
    });
    let loops = (1..5usize).prop_map(|depth| {
        format!(
            "{}{{{{ json('doc') | tojson | length }}}}{}",
            "{% for a in json('list') %}".repeat(depth),
            "{% endfor %}".repeat(depth)
        )
    });
    let filters = prop_oneof![
        Just("{% for x in json('list') %}{{ json('doc') | join(',') | length }}{% endfor %}"),
        Just("{% for x in json('list') %}{{ text('doc') | b64encode | length }}{% endfor %}"),
        Just("{% for x in json('list') %}{{ base64('doc') | b64decode | length }}{% endfor %}"),
        Just("{% for k, v in json('doc') | items %}{{ k }}={{ v | tojson }}{% endfor %}"),
        Just(
            "{% for x in json('list') %}{{ json('doc') | last | tojson | urlencode }}{% endfor %}"
        ),
    ]
    .prop_map(str::to_owned);
    prop_oneof![nested, compares, loops, filters]
}

/// A class of `selections` tag and prefix entries and `histories` version histories of
/// `versions` versions each, over one vault: what listings and their fetches cost.
#[derive(Clone, Debug)]
pub struct Listings {
    pub selections: usize,
    pub histories: usize,
    pub versions: usize,
}

impl Listings {
    pub fn render(&self) -> String {
        let mut secrets = String::new();
        for i in 0..self.selections {
            match i % 3 {
                0 => secrets.push_str(&format!("- tag: team=t{}\n  directory: sel{i}\n", i % 4)),
                1 => secrets.push_str(&format!("- namePrefix: s{}\n  directory: sel{i}\n", i % 10)),
                _ => secrets.push_str(&format!("- tag: team\n  directory: sel{i}\n")),
            }
        }
        for i in 0..self.histories {
            secrets.push_str(&format!("- name: h{i}\n  versions: {}\n", self.versions));
        }
        secrets
    }
}

pub fn listings() -> impl Strategy<Value = Listings> {
    (0..12usize, 0..12usize, 1..11usize).prop_map(|(selections, histories, versions)| Listings {
        selections,
        histories,
        versions,
    })
}
