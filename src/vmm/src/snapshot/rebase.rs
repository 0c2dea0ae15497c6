//! Layers a Diff memory file onto its base (what `rebase-snap` does): every page the diff
//! holds (its data, as opposed to its holes) is copied to the same offset of the base, which
//! then is the Full memory file of the diff's snapshot.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

use crate::sys::seek_data_or_hole;

#[derive(Debug, thiserror::Error)]
pub enum RebaseError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("the diff file is {diff} bytes and the base file {base}; a diff and its base have the same size")]
    Size { base: u64, diff: u64 },
    #[error("cannot copy the diff's pages onto the base: {0}")]
    Copy(#[source] std::io::Error),
}

/// Copies the data of `diff_path` onto `base_path`; returns the bytes copied.
pub fn rebase(base_path: &str, diff_path: &str) -> Result<u64, RebaseError> {
    let open_err = |path: &str| {
        let path = path.to_string();
        move |source| RebaseError::Open { path, source }
    };
    let base = OpenOptions::new()
        .write(true)
        .open(base_path)
        .map_err(open_err(base_path))?;
    let diff = File::open(diff_path).map_err(open_err(diff_path))?;
    let base_len = base.metadata().map_err(open_err(base_path))?.len();
    let diff_len = diff.metadata().map_err(open_err(diff_path))?.len();
    if base_len != diff_len {
        return Err(RebaseError::Size {
            base: base_len,
            diff: diff_len,
        });
    }
    let mut copied = 0;
    let mut at = 0;
    let mut buf = vec![0u8; 1 << 20];
    while let Some(start) =
        seek_data_or_hole(&diff, at, libc::SEEK_DATA).map_err(RebaseError::Copy)?
    {
        let end = seek_data_or_hole(&diff, start, libc::SEEK_HOLE)
            .map_err(RebaseError::Copy)?
            .unwrap_or(diff_len);
        let mut pos = start;
        while pos < end {
            let n = (end - pos).min(buf.len() as u64) as usize;
            diff.read_exact_at(&mut buf[..n], pos)
                .map_err(RebaseError::Copy)?;
            base.write_all_at(&buf[..n], pos)
                .map_err(RebaseError::Copy)?;
            pos += n as u64;
        }
        copied += end - start;
        at = end;
    }
    base.sync_all().map_err(RebaseError::Copy)?;
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diffs_pages_land_on_the_base_and_its_holes_leave_the_base_alone() {
        let dir = std::env::temp_dir().join(format!("ember-rebase-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (base, diff) = (dir.join("base"), dir.join("diff"));
        std::fs::write(&base, vec![1u8; 1 << 20]).unwrap();
        let d = File::create(&diff).unwrap();
        d.set_len(1 << 20).unwrap();
        d.write_all_at(&[7u8; 4096], 8192).unwrap();
        d.write_all_at(&[9u8; 4096], (1 << 20) - 4096).unwrap();
        drop(d);
        let (b, df) = (base.to_str().unwrap(), diff.to_str().unwrap());
        let copied = rebase(b, df).unwrap();
        // Filesystems give data in blocks of at least 4 KiB; both pages, and no more than
        // a few blocks around them, were copied.
        assert!((8192..=4 * 65536).contains(&copied), "{copied}");
        let merged = std::fs::read(&base).unwrap();
        assert!(merged[8192..12288].iter().all(|&b| b == 7));
        assert!(merged[(1 << 20) - 4096..].iter().all(|&b| b == 9));
        assert!(
            merged[..4096].iter().all(|&b| b == 1),
            "a hole left the base"
        );
        std::fs::write(&diff, [0u8; 10]).unwrap();
        let e = rebase(b, df).unwrap_err().to_string();
        assert!(e.contains("the same size"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
