//! Reading configuration files: one file, or a directory of them (envoyproxy/ratelimit reads
//! every file of its runtime directory; tollgate reads `*.yaml` and `*.yml`, skipping hidden ones
//! such as editors' lock files, in name order so that errors are reproducible).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::{Config, ConfigError, MAX_FILE_BYTES, MAX_FILES};

pub(crate) fn load(path: &Path) -> Result<Config, ConfigError> {
    let origin = path.display().to_string();
    let metadata = fs::metadata(path).map_err(|e| ConfigError::new(&origin, "", format!("cannot read: {e}")))?;
    if !metadata.is_dir() {
        return Config::parse(&read(path, &origin)?, &origin);
    }
    let files = yaml_files(path, &origin)?;
    if files.is_empty() {
        return Err(ConfigError::new(&origin, "", "no *.yaml or *.yml file in this directory"));
    }
    let mut config = Config::default();
    for file in files {
        let origin = file.display().to_string();
        config.merge(Config::parse(&read(&file, &origin)?, &origin)?)?;
    }
    Ok(config)
}

/// The directory's visible `*.yaml` / `*.yml` files (symbolic links followed), sorted by name.
fn yaml_files(dir: &Path, origin: &str) -> Result<Vec<PathBuf>, ConfigError> {
    let cannot = |e: std::io::Error| ConfigError::new(origin, "", format!("cannot read the directory: {e}"));
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(cannot)? {
        let path = entry.map_err(cannot)?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        // A Kubernetes ConfigMap's entries are symbolic links: follow them.
        if !yaml || name.starts_with('.') || !fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        if files.len() == MAX_FILES {
            return Err(ConfigError::new(origin, "", format!("more than {MAX_FILES} *.yaml / *.yml files")));
        }
        files.push(path);
    }
    files.sort();
    Ok(files)
}

/// A file's text, refusing one over [`MAX_FILE_BYTES`] (even one growing while it is read).
fn read(path: &Path, origin: &str) -> Result<String, ConfigError> {
    let cannot = |e: std::io::Error| ConfigError::new(origin, "", format!("cannot read: {e}"));
    let mut bytes = Vec::new();
    fs::File::open(path).map_err(cannot)?.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(ConfigError::new(origin, "", format!("larger than {MAX_FILE_BYTES} bytes")));
    }
    String::from_utf8(bytes).map_err(|e| ConfigError::new(origin, "", format!("not UTF-8: {e}")))
}
