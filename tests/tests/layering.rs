//! The layering rule: no import circles between the source files of any crate in the repository.
//!
//! A file imports another when it names an item defined there: a `use` (re-exports are followed
//! to the file that defines the name) or a `crate::`, `super::`, `self::` or child-module path in
//! code. A parent file that uses its child while the child uses `super::X` from the parent is a
//! circle too. Test modules (`#[cfg(test)]`) are left out: they may reach anywhere.
//!
//! Built on `syn` (the parser) and `petgraph` (strongly connected components); the only code of
//! ours is the module-to-file resolution, which no maintained crate offers without loading the
//! whole workspace into rust-analyzer (`cargo-modules`, minutes per CI run).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use petgraph::algo::tarjan_scc;
use petgraph::graph::DiGraph;
use syn::visit::Visit;

/// One module of a crate: the file that holds it, its child modules, and what it re-exports.
#[derive(Default)]
struct Module {
    file: PathBuf,
    children: BTreeSet<String>,
    /// Names brought in by `use` (name -> absolute path it names).
    uses: HashMap<String, Vec<String>>,
    /// Absolute paths this module names (from `use` trees and code).
    refs: Vec<Vec<String>>,
}

/// A crate's module tree, keyed by absolute module path (`[]` is the crate root).
#[derive(Default)]
struct Tree {
    modules: BTreeMap<Vec<String>, Module>,
}

/// `#[cfg(test)]`, `#[cfg(any(test, ...))]`: code that only tests compile (`not(test)` is not).
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| match &a.meta {
        syn::Meta::List(list) if list.path.is_ident("cfg") => {
            let text = list.tokens.to_string();
            !text.starts_with("not")
                && text
                    .split(|c: char| c.is_whitespace() || "(),".contains(c))
                    .any(|w| w == "test")
        }
        _ => false,
    })
}

fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// Flattens a use tree into (bound name, path) pairs; `*` binds the name `*`.
fn flatten_use(prefix: &[String], tree: &syn::UseTree, out: &mut Vec<(String, Vec<String>)>) {
    match tree {
        syn::UseTree::Path(p) => {
            let mut next = prefix.to_vec();
            next.push(p.ident.to_string());
            flatten_use(&next, &p.tree, out);
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            let mut path = prefix.to_vec();
            if name != "self" {
                path.push(name.clone());
            }
            let bound = if name == "self" {
                prefix.last().cloned().unwrap_or_default()
            } else {
                name
            };
            out.push((bound, path));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.to_vec();
            path.push(r.ident.to_string());
            out.push((r.rename.to_string(), path));
        }
        syn::UseTree::Glob(_) => out.push(("*".into(), prefix.to_vec())),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| flatten_use(prefix, t, out)),
    }
}

/// Collects the paths named in code (outside `use` items and test modules).
struct CodePaths<'a> {
    paths: &'a mut Vec<Vec<String>>,
}
impl<'ast> Visit<'ast> for CodePaths<'_> {
    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.segments.len() >= 2 {
            self.paths
                .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, p);
    }
    fn visit_item_use(&mut self, _: &'ast syn::ItemUse) {}
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // Inline modules are walked by `load_items` with their own module path.
        let _ = m;
    }
}

impl Tree {
    fn load(root: &Path) -> Tree {
        let mut tree = Tree::default();
        tree.load_file(root, Vec::new(), true);
        tree
    }

    fn load_file(&mut self, file: &Path, module: Vec<String>, owns_dir: bool) {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let dir = if owns_dir {
            file.parent().unwrap().to_path_buf()
        } else {
            file.with_extension("")
        };
        self.load_items(file, &dir, module, &parsed.items);
    }

    fn load_items(&mut self, file: &Path, dir: &Path, module: Vec<String>, items: &[syn::Item]) {
        self.modules.entry(module.clone()).or_default().file = file.to_path_buf();
        let mut refs = Vec::new();
        for item in items {
            match item {
                syn::Item::Mod(m) if is_cfg_test(&m.attrs) => {}
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    let mut child = module.clone();
                    child.push(name.clone());
                    self.modules
                        .get_mut(&module)
                        .unwrap()
                        .children
                        .insert(name.clone());
                    if let Some((_, inline)) = &m.content {
                        self.load_items(file, &dir.join(&name), child, inline);
                    } else if let Some(path) = path_attr(&m.attrs) {
                        let base = file.parent().unwrap();
                        self.load_file(&base.join(path), child, true);
                    } else if dir.join(format!("{name}.rs")).exists() {
                        self.load_file(&dir.join(format!("{name}.rs")), child, false);
                    } else {
                        self.load_file(&dir.join(&name).join("mod.rs"), child, true);
                    }
                }
                syn::Item::Use(u) if is_cfg_test(&u.attrs) => {}
                syn::Item::Use(u) => {
                    let mut flat = Vec::new();
                    flatten_use(&[], &u.tree, &mut flat);
                    for (bound, path) in flat {
                        refs.push(path.clone());
                        self.modules
                            .get_mut(&module)
                            .unwrap()
                            .uses
                            .insert(bound, path);
                    }
                }
                syn::Item::Fn(f) if is_cfg_test(&f.attrs) => {}
                syn::Item::Impl(i) if is_cfg_test(&i.attrs) => {}
                other => CodePaths { paths: &mut refs }.visit_item(other),
            }
        }
        self.modules.get_mut(&module).unwrap().refs.extend(refs);
    }

    /// Turns a path named in `module` into an absolute one, or `None` when it names another
    /// crate (or the standard library).
    fn absolute(&self, module: &[String], path: &[String]) -> Option<Vec<String>> {
        let first = path.first()?;
        let (mut base, rest): (Vec<String>, &[String]) = match first.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (module.to_vec(), &path[1..]),
            "super" => {
                let mut base = module.to_vec();
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                (base, rest)
            }
            name if self.modules[module].children.contains(name) => (module.to_vec(), path),
            _ => return None,
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The file that defines what `path` names, following re-exports.
    fn defining_file(&self, path: &[String], depth: usize) -> Option<&Path> {
        let split = (0..=path.len())
            .rev()
            .find(|&n| self.modules.contains_key(&path[..n]))?;
        let (module, rest) = path.split_at(split);
        let owner = &self.modules[module];
        if let Some(name) = rest.first()
            && depth < 8
            && let Some(target) = owner.uses.get(name)
            && let Some(mut abs) = self.absolute(module, target)
        {
            abs.extend(rest[1..].iter().cloned());
            return self.defining_file(&abs, depth + 1);
        }
        Some(&owner.file)
    }

    /// File-to-file import edges, each with the names that make it.
    fn edges(&self) -> BTreeMap<(PathBuf, PathBuf), BTreeSet<String>> {
        let mut edges: BTreeMap<(PathBuf, PathBuf), BTreeSet<String>> = BTreeMap::new();
        for (module, m) in &self.modules {
            for path in &m.refs {
                let Some(abs) = self.absolute(module, path) else {
                    continue;
                };
                let Some(to) = self.defining_file(&abs, 0) else {
                    continue;
                };
                if to != m.file {
                    edges
                        .entry((m.file.clone(), to.to_path_buf()))
                        .or_default()
                        .insert(abs.join("::"));
                }
            }
        }
        edges
    }

    /// Every import circle: the files of each, and the edges inside it.
    fn circles(&self) -> Vec<String> {
        let edges = self.edges();
        let mut graph = DiGraph::<PathBuf, ()>::new();
        let mut index = HashMap::new();
        for (from, to) in edges.keys() {
            for file in [from, to] {
                index
                    .entry(file.clone())
                    .or_insert_with(|| graph.add_node(file.clone()));
            }
            graph.add_edge(index[from], index[to], ());
        }
        tarjan_scc(&graph)
            .into_iter()
            .filter(|scc| scc.len() > 1)
            .map(|scc| {
                let files: BTreeSet<&PathBuf> = scc.iter().map(|&n| &graph[n]).collect();
                let mut text = String::from("circle:\n");
                for ((from, to), names) in &edges {
                    if files.contains(from) && files.contains(to) {
                        let names: Vec<&str> = names.iter().map(String::as_str).collect();
                        text += &format!(
                            "  {} -> {}: {}\n",
                            from.display(),
                            to.display(),
                            names.join(", ")
                        );
                    }
                }
                text
            })
            .collect()
    }
}

/// Every crate root in the repository: `src/lib.rs`, `src/main.rs`, `src/bin/*.rs`.
fn crate_roots(repo: &Path) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for entry in std::fs::read_dir(repo).unwrap().flatten() {
        let src = entry.path().join("src");
        if !entry.path().join("Cargo.toml").exists() || !src.is_dir() {
            continue;
        }
        roots.extend(
            ["lib.rs", "main.rs"]
                .map(|f| src.join(f))
                .into_iter()
                .filter(|p| p.exists()),
        );
        if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
            roots.extend(
                bins.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "rs")),
            );
        }
    }
    roots.sort();
    roots
}

#[test]
fn no_crate_has_an_import_circle() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let roots = crate_roots(repo);
    assert!(roots.len() >= 10, "found only {roots:?}");
    let circles: Vec<String> = roots
        .iter()
        .flat_map(|root| Tree::load(root).circles())
        .collect();
    let circles = circles.into_iter().collect::<BTreeSet<_>>();
    assert!(
        circles.is_empty(),
        "{} import circle(s):\n{}",
        circles.len(),
        circles.into_iter().collect::<Vec<_>>().join("")
    );
}

#[test]
fn a_parent_and_child_that_use_each_other_are_a_circle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod c;\npub use a::Thing;\n").unwrap();
    std::fs::write(
        src.join("a.rs"),
        "mod b;\npub use b::Thing;\npub struct Config;\n",
    )
    .unwrap();
    std::fs::write(src.join("a/b.rs"), "pub struct Thing(super::Config);\n").unwrap();
    // `c` reaches `Thing` through the crate root's re-export: an edge to a/b.rs, not a circle.
    std::fs::write(src.join("c.rs"), "use crate::Thing;\nfn f(_: Thing) {}\n").unwrap();
    let circles = Tree::load(&src.join("lib.rs")).circles();
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(
        circles[0].contains("a.rs") && circles[0].contains("b.rs"),
        "{}",
        circles[0]
    );
    assert!(!circles[0].contains("c.rs"), "{}", circles[0]);
}
