//! The dependency rule of README's "How it is built", read from the source: faces -> agent -> {semantics,
//! datapath, sources} -> model. Every `.rs` file of lb-user, lb-common and lb-ebpf is read (read.rs); its
//! module dependencies are the paths of its `use` trees and the `crate::`, `super::` and child-module paths
//! in its code, each resolved to the longest module that has a file, and a path that stops at the crate
//! root to the root's item it names, a re-export followed to the module that holds it (resolve.rs).
//! Comments, string and char literals do not count, nor `#[cfg(test)]` modules (inline or in their own
//! file): a test may read any module to check it, and no product code depends on it.
//!
//! The crate root is a module of its own (not the parent of every other): its items are a part in each
//! table, its re-exports are not its dependencies, and what its items name through them is (a bare name
//! one of its `use`s brought in counts as an import). Root items that gather from the modules above it
//! (lb-common's lists of every map) are a part of their own, the catalogue; imports a misplaced definition
//! makes today are listed as known until it moves (tables.rs).
//!
//! Two checks (check.rs): no circle among files once a module's own files are set aside (a parent and its
//! child modules, `plan.rs` and `plan/external_frontends.rs`, are one module and may use each other), and
//! no import against the crate's layer table (tables.rs).
use std::path::Path;

mod check;
mod lex;
mod read;
mod resolve;
mod synthetic;
mod tables;

use check::{check_layers, circle_failures};
use resolve::{Read, read_tree, sources};
use tables::{CRATES, Crate};

/// `krate` as it is in the workspace, its files named from the workspace root.
fn read_crate(krate: &Crate) -> Read {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("lb-user is in the workspace");
    let read = read_tree(krate, &sources(&workspace.join(krate.dir).join("src")));
    assert!(read.files.len() > 3, "{}: no source files found", krate.dir);
    read
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let failures: Vec<String> =
        CRATES.iter().flat_map(|k| circle_failures(k, &read_crate(k).files)).collect();
    assert!(
        failures.is_empty(),
        "{}\nMove what both sides need down into a module both may import (README, \"How it is built\").",
        failures.join("\n")
    );
}

#[test]
fn imports_point_down_the_layers() {
    let mut failures = Vec::new();
    for krate in CRATES {
        let read = read_crate(krate);
        failures.extend(read.problems);
        failures.extend(check_layers(krate, &read.files));
    }
    assert!(
        failures.is_empty(),
        "{}\nfaces -> agent -> {{semantics, datapath, sources}} -> model: move the definition down (README, \"How it \
         is built\")",
        failures.join("\n")
    );
}
