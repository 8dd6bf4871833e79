//! Output helpers: tables for the terminal and Markdown, and output directories written
//! atomically (staged beside the target, renamed into place at the end).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use comfy_table::presets::{ASCII_MARKDOWN, NOTHING};
use comfy_table::{CellAlignment, Table};

/// A table with a header row, rendered either for a terminal or as Markdown.
pub struct Grid {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    /// Columns (by index) whose cells are right-aligned (numbers).
    right: Vec<usize>,
}

impl Grid {
    /// An empty table with these column titles.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Grid {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
            right: Vec::new(),
        }
    }

    /// Right-aligns the columns from `first` on (the numeric ones).
    pub fn right_align_from(mut self, first: usize) -> Self {
        self.right = (first..self.header.len()).collect();
        self
    }

    /// Adds a row.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    fn render(&self, markdown: bool) -> String {
        let mut t = Table::new();
        t.load_style(if markdown { ASCII_MARKDOWN } else { NOTHING });
        t.set_header(self.header.clone());
        for r in &self.rows {
            t.add_row(r.clone());
        }
        for &c in &self.right {
            if let Some(col) = t.column_mut(c) {
                col.set_cell_alignment(CellAlignment::Right);
            }
        }
        let text = t.to_string();
        // The borderless style pads every line to the widest cell; trailing blanks
        // are noise in a terminal and in snapshots.
        let mut out: String = text
            .lines()
            .map(str::trim_end)
            .collect::<Vec<_>>()
            .join("\n");
        out.push('\n');
        out
    }

    /// The table for a terminal: aligned columns, no borders.
    pub fn plain(&self) -> String {
        self.render(false)
    }

    /// The table as GitHub-flavoured Markdown.
    pub fn markdown(&self) -> String {
        self.render(true)
    }
}

/// An output directory written atomically: files go into a hidden staging directory
/// beside the target, which [`StagedDir::commit`] renames into place. Dropped without
/// a commit (an error on the way), the staging directory is removed and the target is
/// left as it was.
pub struct StagedDir {
    target: PathBuf,
    parent: PathBuf,
    staging: tempfile::TempDir,
    marker: &'static str,
}

impl StagedDir {
    /// Prepares to write `target`. An existing `target` is replaced at commit only if
    /// it is empty or holds `marker` (a file this command writes), so a mistyped path
    /// never wipes an unrelated directory. Fails at once, before any work, if the
    /// target's parent cannot be written.
    pub fn new(target: &Path, marker: &'static str) -> anyhow::Result<Self> {
        let shown = target.display();
        let name = match target.file_name() {
            Some(n) => n.to_os_string(),
            None => bail!("cannot write to {shown}: give a directory name, not '..' or '/'"),
        };
        let parent = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if target.exists() {
            check_replaceable(target, marker)?;
        }
        if !parent.is_dir() {
            bail!(
                "cannot write to {shown}: its parent directory {} does not exist",
                parent.display()
            );
        }
        let staging = tempfile::Builder::new()
            .prefix(&hidden(&name, ".tmp-"))
            .tempdir_in(&parent)
            .map_err(|e| anyhow::anyhow!("cannot write to {shown}: {e}"))?;
        Ok(StagedDir {
            target: target.to_path_buf(),
            parent,
            staging,
            marker,
        })
    }

    /// Writes one file into the staging directory.
    pub fn write(&self, file: &str, bytes: impl AsRef<[u8]>) -> anyhow::Result<()> {
        let path = self.staging.path().join(file);
        std::fs::write(&path, bytes)
            .with_context(|| format!("cannot write {}", self.target.join(file).display()))
    }

    /// The staging directory (for writers that want a path, e.g. chart backends).
    pub fn staging_path(&self, file: &str) -> PathBuf {
        self.staging.path().join(file)
    }

    /// Renames the staging directory into place, replacing a previous output.
    pub fn commit(self) -> anyhow::Result<PathBuf> {
        let shown = self.target.display().to_string();
        if !self.staging.path().join(self.marker).is_file() {
            bail!("internal error: {shown} would lack {}", self.marker);
        }
        let name = self
            .target
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        // Move an earlier output aside first: rename(2) cannot replace a non-empty
        // directory. It comes back if the final rename fails.
        let old = if self.target.exists() {
            check_replaceable(&self.target, self.marker)?;
            let aside = tempfile::Builder::new()
                .prefix(&hidden(&name, ".old-"))
                .tempdir_in(&self.parent)
                .with_context(|| format!("cannot replace {shown}"))?
                .keep();
            std::fs::rename(&self.target, &aside)
                .with_context(|| format!("cannot replace {shown}"))?;
            Some(aside)
        } else {
            None
        };
        let staging = self.staging.keep();
        if let Err(e) = std::fs::rename(&staging, &self.target) {
            if let Some(aside) = &old {
                let _ = std::fs::rename(aside, &self.target);
            }
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e).with_context(|| format!("cannot write {shown}"));
        }
        if let Some(aside) = old {
            std::fs::remove_dir_all(&aside).with_context(|| {
                format!(
                    "wrote {shown} but could not remove the previous output moved to {}",
                    aside.display()
                )
            })?;
        }
        Ok(self.target)
    }
}

/// `.NAME` + `suffix`, for hidden staging names beside the target.
fn hidden(name: &std::ffi::OsStr, suffix: &str) -> OsString {
    let mut s = OsString::from(".");
    s.push(name);
    s.push(suffix);
    s
}

/// An existing target may be replaced only if it is an empty directory or an earlier
/// output of the same command.
fn check_replaceable(target: &Path, marker: &str) -> anyhow::Result<()> {
    let shown = target.display();
    if !target.is_dir() {
        bail!("cannot write to {shown}: it exists and is not a directory");
    }
    let mut entries = std::fs::read_dir(target).with_context(|| format!("cannot read {shown}"))?;
    if entries.next().is_some() && !target.join(marker).is_file() {
        bail!(
            "cannot write to {shown}: it is a non-empty directory that holds no earlier \
             {marker}; choose a new or empty directory"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_replaces_an_earlier_output_and_nothing_is_left_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out");

        let staged = StagedDir::new(&target, "m.json").unwrap();
        staged.write("m.json", "1").unwrap();
        staged.commit().unwrap();
        assert_eq!(std::fs::read_to_string(target.join("m.json")).unwrap(), "1");

        let staged = StagedDir::new(&target, "m.json").unwrap();
        staged.write("m.json", "2").unwrap();
        drop(staged);
        assert_eq!(std::fs::read_to_string(target.join("m.json")).unwrap(), "1");

        let staged = StagedDir::new(&target, "m.json").unwrap();
        staged.write("m.json", "3").unwrap();
        staged.commit().unwrap();
        assert_eq!(std::fs::read_to_string(target.join("m.json")).unwrap(), "3");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no staging or old directory left behind");
    }

    #[test]
    fn an_unrelated_directory_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("precious.txt"), "x").unwrap();
        let err = StagedDir::new(dir.path(), "m.json").err().unwrap();
        assert!(err.to_string().contains("non-empty directory"), "{err}");
    }

    #[test]
    fn markdown_tables_have_a_separator_row() {
        let mut g = Grid::new(["a", "b"]).right_align_from(1);
        g.row(["x", "1"]);
        let md = g.markdown();
        let lines: Vec<&str> = md.lines().collect();
        assert!(lines[0].starts_with("| a"), "{md}");
        assert!(lines[1].starts_with("|--"), "{md}");
        assert!(lines[2].contains("| x"), "{md}");
    }
}
