//! The lazy filesystem's model, without FUSE: what the processes see (the page cache) and
//! what reached the disk, and the moment between them that a power loss takes away.
//!
//! Each file's contents on the disk live in a file of the backing directory named by its
//! inode number; what was written since the file's last `fsync` lives here in memory, as
//! the writes themselves, in order (an append to the write before it extends it). Names
//! live in memory twice: the directories as the processes see them, and as the disk holds
//! them, with the journal of changes (created, removed, renamed) between the two.
//!
//! When a change reaches the disk, as the kernel would: a file's writes at its `fsync` (or
//! `fdatasync`); a directory's changes at its `fsync`, and, with [`Journal::Ordered`] (ext4's
//! one journal, the default), every change of every directory at any `fsync`, in the order
//! they were made. [`Disk::write_back`] writes everything back (the kernel's writeback, or
//! a sync of every file), [`Disk::write_back_older_than`] what was written before a moment
//! (the kernel writes back pages dirty for longer than `dirty_expire_centisecs`).
//! [`Disk::lose_power`] keeps exactly what reached the disk, file by file.
//!
//! Harsher than ext4 in one way: ext4 commits its journal every 5 s and flushes a file
//! replaced by a rename at the commit (`auto_da_alloc`); here names reach the disk only
//! with a sync or a write-back, and a file renamed over another without a sync comes back
//! with what its inode held on the disk, maybe nothing.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

pub type Ino = u64;
pub const ROOT: Ino = 1;

/// When a sync of a file also makes the names of every directory durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Journal {
    /// ext4, xfs: one journal, committed in order at any `fsync`.
    Ordered,
    /// POSIX to the letter: a directory's entries only at that directory's `fsync`.
    PerDirectory,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

/// An error as the filesystem answers it: an errno.
pub type Result<T> = std::result::Result<T, i32>;

/// A change to a file not yet on the disk.
#[derive(Debug)]
enum Write {
    At { offset: u64, data: Vec<u8>, first: Instant, last: Instant },
    SetLen { len: u64, at: Instant },
}

impl Write {
    fn at(&self) -> Instant {
        match self {
            Write::At { last, .. } => *last,
            Write::SetLen { at, .. } => *at,
        }
    }
}

/// A change to a directory not yet on the disk. A rename is two, made at one instant.
#[derive(Debug)]
struct Change {
    dir: Ino,
    name: OsString,
    /// Some: the name now points to this inode; None: the name is gone.
    to: Option<Ino>,
    at: Instant,
}

#[derive(Debug)]
pub struct Inode {
    pub kind: Kind,
    pub perm: u16,
    pub mtime: SystemTime,
    /// What the processes see.
    pub size: u64,
    durable_size: u64,
    pending: Vec<Write>,
    entries: BTreeMap<OsString, Ino>,
    durable_entries: BTreeMap<OsString, Ino>,
}

impl Inode {
    fn new(kind: Kind, perm: u16) -> Inode {
        Inode {
            kind,
            perm,
            mtime: SystemTime::now(),
            size: 0,
            durable_size: 0,
            pending: Vec::new(),
            entries: BTreeMap::new(),
            durable_entries: BTreeMap::new(),
        }
    }
}

/// Appends within this time of the write they extend are one write (the kernel's page
/// granularity stands in for it: write-back by age takes them together).
const COALESCE: Duration = Duration::from_millis(100);

pub struct Disk {
    backing: PathBuf,
    journal: Journal,
    inodes: BTreeMap<Ino, Inode>,
    changes: Vec<Change>,
    next: Ino,
}

impl Disk {
    /// An empty filesystem whose disk is `backing` (an existing, empty directory).
    pub fn new(backing: PathBuf, journal: Journal) -> Disk {
        let mut inodes = BTreeMap::new();
        inodes.insert(ROOT, Inode::new(Kind::Dir, 0o755));
        Disk { backing, journal, inodes, changes: Vec::new(), next: ROOT + 1 }
    }

    pub fn inode(&self, ino: Ino) -> Result<&Inode> {
        self.inodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn inode_mut(&mut self, ino: Ino) -> Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn dir(&self, ino: Ino) -> Result<&Inode> {
        let dir = self.inode(ino)?;
        if dir.kind != Kind::Dir {
            return Err(libc::ENOTDIR);
        }
        Ok(dir)
    }

    pub fn lookup(&self, dir: Ino, name: &OsStr) -> Result<Ino> {
        self.dir(dir)?.entries.get(name).copied().ok_or(libc::ENOENT)
    }

    /// The live entries of a directory, in name order.
    pub fn entries(&self, dir: Ino) -> Result<Vec<(OsString, Ino, Kind)>> {
        let entries = self.dir(dir)?.entries.iter();
        let kind = |ino: &Ino| self.inodes.get(ino).map_or(Kind::File, |i| i.kind);
        Ok(entries.map(|(name, ino)| (name.clone(), *ino, kind(ino))).collect())
    }

    fn set_entry(&mut self, dir: Ino, name: &OsStr, to: Option<Ino>, at: Instant) -> Result<()> {
        let entries = &mut self.inode_mut(dir)?.entries;
        match to {
            Some(ino) => entries.insert(name.to_owned(), ino),
            None => entries.remove(name),
        };
        self.inode_mut(dir)?.mtime = SystemTime::now();
        self.changes.push(Change { dir, name: name.to_owned(), to, at });
        Ok(())
    }

    /// A new file or directory `name` in `dir`.
    pub fn create(&mut self, dir: Ino, name: &OsStr, kind: Kind, perm: u16) -> Result<Ino> {
        if self.dir(dir)?.entries.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.next;
        self.next += 1;
        self.inodes.insert(ino, Inode::new(kind, perm));
        self.set_entry(dir, name, Some(ino), Instant::now())?;
        Ok(ino)
    }

    /// Removes a file (`rmdir`: false) or an empty directory (true). The inode stays: the
    /// disk may still name it, and a process may still have it open.
    pub fn remove(&mut self, dir: Ino, name: &OsStr, rmdir: bool) -> Result<()> {
        let ino = self.lookup(dir, name)?;
        let inode = self.inode(ino)?;
        match (inode.kind, rmdir) {
            (Kind::Dir, false) => return Err(libc::EISDIR),
            (Kind::File, true) => return Err(libc::ENOTDIR),
            (Kind::Dir, true) if !inode.entries.is_empty() => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        self.set_entry(dir, name, None, Instant::now())
    }

    /// `rename(2)` without flags (`noreplace`: `RENAME_NOREPLACE`).
    pub fn rename(
        &mut self,
        from: (Ino, &OsStr),
        to: (Ino, &OsStr),
        noreplace: bool,
    ) -> Result<()> {
        let ino = self.lookup(from.0, from.1)?;
        self.dir(to.0)?;
        if let Ok(there) = self.lookup(to.0, to.1) {
            if there == ino {
                return Ok(());
            }
            let there = self.inode(there)?;
            match (noreplace, there.kind, self.inode(ino)?.kind) {
                (true, _, _) => return Err(libc::EEXIST),
                (_, Kind::Dir, Kind::File) => return Err(libc::EISDIR),
                (_, Kind::File, Kind::Dir) => return Err(libc::ENOTDIR),
                (_, Kind::Dir, Kind::Dir) if !there.entries.is_empty() => {
                    return Err(libc::ENOTEMPTY);
                }
                _ => {}
            }
        }
        let now = Instant::now();
        self.set_entry(from.0, from.1, None, now)?;
        self.set_entry(to.0, to.1, Some(ino), now)
    }

    pub fn read(&self, ino: Ino, offset: u64, len: u32) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        if inode.kind == Kind::Dir {
            return Err(libc::EISDIR);
        }
        let end = inode.size.min(offset.saturating_add(u64::from(len)));
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut buf = vec![0; (end - offset) as usize];
        let on_disk = inode.durable_size.min(end);
        if offset < on_disk {
            let file = File::open(self.backing.join(ino.to_string())).map_err(errno)?;
            file.read_exact_at(&mut buf[..(on_disk - offset) as usize], offset).map_err(errno)?;
        }
        for write in &inode.pending {
            match write {
                Write::At { offset: at, data, .. } => {
                    let from = (*at).max(offset);
                    let to = (at + data.len() as u64).min(end);
                    if from < to {
                        let src = &data[(from - at) as usize..(to - at) as usize];
                        buf[(from - offset) as usize..(to - offset) as usize].copy_from_slice(src);
                    }
                }
                Write::SetLen { len, .. } if *len < end => {
                    buf[(len.saturating_sub(offset)) as usize..].fill(0);
                }
                Write::SetLen { .. } => {}
            }
        }
        Ok(buf)
    }

    pub fn write(&mut self, ino: Ino, offset: u64, data: &[u8]) -> Result<()> {
        let inode = self.inode_mut(ino)?;
        if inode.kind == Kind::Dir {
            return Err(libc::EISDIR);
        }
        let now = Instant::now();
        inode.size = inode.size.max(offset + data.len() as u64);
        inode.mtime = SystemTime::now();
        if let Some(Write::At { offset: at, data: before, first, last }) = inode.pending.last_mut()
            && *at + before.len() as u64 == offset
            && now.duration_since(*first) < COALESCE
        {
            before.extend_from_slice(data);
            *last = now;
            return Ok(());
        }
        inode.pending.push(Write::At { offset, data: data.to_vec(), first: now, last: now });
        Ok(())
    }

    pub fn set_len(&mut self, ino: Ino, len: u64) -> Result<()> {
        let inode = self.inode_mut(ino)?;
        if inode.kind == Kind::Dir {
            return Err(libc::EISDIR);
        }
        inode.size = len;
        inode.mtime = SystemTime::now();
        inode.pending.push(Write::SetLen { len, at: Instant::now() });
        Ok(())
    }

    pub fn set_perm(&mut self, ino: Ino, perm: u16) -> Result<()> {
        self.inode_mut(ino)?.perm = perm;
        Ok(())
    }

    /// `fsync` or `fdatasync` of a file; of a directory, its entries.
    pub fn fsync(&mut self, ino: Ino) -> Result<()> {
        match self.inode(ino)?.kind {
            Kind::File => {
                self.write_back_file(ino, None)?;
                if self.journal == Journal::Ordered {
                    self.commit(|_| true);
                }
            }
            Kind::Dir => self.commit(|change| change.dir == ino),
        }
        Ok(())
    }

    /// Everything written so far reaches the disk.
    pub fn write_back(&mut self) -> Result<()> {
        self.write_back_older_than(Instant::now())
    }

    /// What was written (file contents) and changed (names) before `moment` reaches the
    /// disk, each file's and the journal's in order: a prefix of each.
    pub fn write_back_older_than(&mut self, moment: Instant) -> Result<()> {
        let files: Vec<Ino> = self.inodes.keys().copied().collect();
        for ino in files {
            self.write_back_file(ino, Some(moment))?;
        }
        let first_newer = self.changes.iter().position(|c| c.at > moment);
        let older = first_newer.unwrap_or(self.changes.len());
        let mut index = 0;
        self.commit(|_| {
            index += 1;
            index <= older
        });
        Ok(())
    }

    /// Applies to the disk the changes to names that `durable` picks, in order.
    fn commit(&mut self, mut durable: impl FnMut(&Change) -> bool) {
        let changes = std::mem::take(&mut self.changes);
        for change in changes {
            if !durable(&change) {
                self.changes.push(change);
                continue;
            }
            if let Some(dir) = self.inodes.get_mut(&change.dir) {
                match change.to {
                    Some(ino) => dir.durable_entries.insert(change.name, ino),
                    None => dir.durable_entries.remove(&change.name),
                };
            }
        }
    }

    /// Writes `ino`'s pending writes (those before `moment` if given) to its file on the disk.
    fn write_back_file(&mut self, ino: Ino, moment: Option<Instant>) -> Result<()> {
        let path = self.backing.join(ino.to_string());
        let inode = self.inode_mut(ino)?;
        let count = match moment {
            Some(moment) => inode.pending.iter().take_while(|w| w.at() <= moment).count(),
            None => inode.pending.len(),
        };
        if count == 0 {
            return Ok(());
        }
        let mut options = std::fs::OpenOptions::new();
        let file = options.create(true).write(true).truncate(false).open(path).map_err(errno)?;
        let mut size = inode.durable_size;
        for write in inode.pending.drain(..count) {
            match write {
                Write::At { offset, data, .. } => {
                    file.write_all_at(&data, offset).map_err(errno)?;
                    size = size.max(offset + data.len() as u64);
                }
                Write::SetLen { len, .. } => {
                    file.set_len(len).map_err(errno)?;
                    size = len;
                }
            }
        }
        file.set_len(size).map_err(errno)?;
        inode.durable_size = size;
        Ok(())
    }

    /// A power loss: every file holds what reached the disk, every directory the names that
    /// did. Returns how many bytes written and names changed were lost.
    pub fn lose_power(&mut self) -> (u64, usize) {
        let names = std::mem::take(&mut self.changes).len();
        let mut bytes = 0;
        for inode in self.inodes.values_mut() {
            for write in inode.pending.drain(..) {
                if let Write::At { data, .. } = write {
                    bytes += data.len() as u64;
                }
            }
            inode.size = inode.durable_size;
            inode.entries = inode.durable_entries.clone();
        }
        (bytes, names)
    }
}

fn errno(error: io::Error) -> i32 {
    error.raw_os_error().unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(journal: Journal) -> (tempfile::TempDir, Disk) {
        let backing = tempfile::tempdir().expect("a backing directory");
        let disk = Disk::new(backing.path().to_owned(), journal);
        (backing, disk)
    }

    fn name(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    fn contents(disk: &Disk, ino: Ino) -> Vec<u8> {
        disk.read(ino, 0, u32::MAX).expect("read")
    }

    #[test]
    fn a_power_loss_keeps_what_was_synced_and_drops_the_rest() {
        let (_backing, mut disk) = disk(Journal::Ordered);
        let f = disk.create(ROOT, name("1.blk"), Kind::File, 0o644).expect("create");
        disk.write(f, 0, b"first").expect("write");
        disk.fsync(f).expect("fsync");
        disk.write(f, 5, b" second").expect("write");
        assert_eq!(contents(&disk, f), b"first second");
        assert_eq!(disk.lose_power(), (7, 0));
        assert_eq!(contents(&disk, f), b"first");
        assert_eq!(disk.inode(f).expect("inode").size, 5);
    }

    #[test]
    fn writes_over_the_synced_part_are_lost_too_and_reads_merge_them_in_order() {
        let (_backing, mut disk) = disk(Journal::Ordered);
        let f = disk.create(ROOT, name("f"), Kind::File, 0o644).expect("create");
        disk.write(f, 0, b"aaaaaaaa").expect("write");
        disk.fsync(f).expect("fsync");
        disk.write(f, 2, b"bb").expect("write");
        disk.set_len(f, 3).expect("truncate");
        disk.write(f, 5, b"c").expect("write");
        assert_eq!(contents(&disk, f), b"aab\0\0c");
        assert_eq!(disk.read(f, 1, 3).expect("read"), b"ab\0");
        disk.lose_power();
        assert_eq!(contents(&disk, f), b"aaaaaaaa");
    }

    #[test]
    fn a_file_never_synced_and_its_name_are_lost() {
        let (_backing, mut disk) = disk(Journal::Ordered);
        let f = disk.create(ROOT, name("index.db"), Kind::File, 0o644).expect("create");
        disk.write(f, 0, b"state").expect("write");
        disk.lose_power();
        assert_eq!(disk.lookup(ROOT, name("index.db")), Err(libc::ENOENT));
    }

    #[test]
    fn an_ordered_journal_commits_every_name_at_any_fsync_but_not_other_files_data() {
        let (_backing, mut disk) = disk(Journal::Ordered);
        let d = disk.create(ROOT, name("msgs"), Kind::Dir, 0o755).expect("mkdir");
        let a = disk.create(d, name("1.blk"), Kind::File, 0o644).expect("create");
        let b = disk.create(d, name("index.db"), Kind::File, 0o644).expect("create");
        disk.write(a, 0, b"synced").expect("write");
        disk.write(b, 0, b"not synced").expect("write");
        disk.fsync(a).expect("fsync");
        disk.lose_power();
        assert_eq!(disk.lookup(ROOT, name("msgs")), Ok(d));
        assert_eq!(contents(&disk, disk.lookup(d, name("1.blk")).expect("1.blk")), b"synced");
        // Its name reached the disk, its contents did not: an empty file.
        assert_eq!(contents(&disk, disk.lookup(d, name("index.db")).expect("index")), b"");
    }

    #[test]
    fn per_directory_a_synced_file_in_a_directory_never_synced_is_lost() {
        let (_backing, mut disk) = disk(Journal::PerDirectory);
        let d = disk.create(ROOT, name("msgs"), Kind::Dir, 0o755).expect("mkdir");
        let a = disk.create(d, name("1.blk"), Kind::File, 0o644).expect("create");
        disk.write(a, 0, b"synced").expect("write");
        disk.fsync(a).expect("fsync");
        disk.fsync(d).expect("fsync the directory, not its parent");
        disk.lose_power();
        assert_eq!(disk.lookup(ROOT, name("msgs")), Err(libc::ENOENT));
        assert_eq!(disk.lookup(d, name("1.blk")), Ok(a), "the directory's own entries");
    }

    #[test]
    fn a_rename_and_a_removal_not_synced_come_undone() {
        let (_backing, mut disk) = disk(Journal::PerDirectory);
        let old = disk.create(ROOT, name("index.db"), Kind::File, 0o644).expect("create");
        disk.write(old, 0, b"old").expect("write");
        disk.fsync(old).expect("fsync");
        let gone = disk.create(ROOT, name("2.blk"), Kind::File, 0o644).expect("create");
        disk.fsync(ROOT).expect("fsync the directory");
        let new = disk.create(ROOT, name("index.tmp"), Kind::File, 0o644).expect("create");
        disk.write(new, 0, b"new").expect("write");
        disk.fsync(new).expect("fsync");
        disk.rename((ROOT, name("index.tmp")), (ROOT, name("index.db")), false).expect("mv");
        disk.remove(ROOT, name("2.blk"), false).expect("rm");
        assert_eq!(disk.lookup(ROOT, name("index.db")), Ok(new));
        disk.lose_power();
        assert_eq!(disk.lookup(ROOT, name("index.db")), Ok(old));
        assert_eq!(disk.lookup(ROOT, name("2.blk")), Ok(gone));
        assert_eq!(disk.lookup(ROOT, name("index.tmp")), Err(libc::ENOENT));
        assert_eq!(contents(&disk, old), b"old");
    }

    #[test]
    fn a_write_back_by_age_keeps_a_prefix_of_each_file_and_of_the_journal() {
        let (_backing, mut disk) = disk(Journal::Ordered);
        let f = disk.create(ROOT, name("1.blk"), Kind::File, 0o644).expect("create");
        disk.write(f, 0, b"old").expect("write");
        std::thread::sleep(COALESCE + Duration::from_millis(20));
        let moment = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        disk.write(f, 3, b"new").expect("write");
        disk.create(ROOT, name("2.blk"), Kind::File, 0o644).expect("create");
        disk.write_back_older_than(moment).expect("write back");
        disk.lose_power();
        assert_eq!(contents(&disk, f), b"old");
        assert_eq!(disk.lookup(ROOT, name("1.blk")), Ok(f));
        assert_eq!(disk.lookup(ROOT, name("2.blk")), Err(libc::ENOENT));
    }

    #[test]
    fn rename_and_remove_refuse_as_the_kernel_does() {
        let (_backing, mut disk) = disk(Journal::Ordered);
        let d = disk.create(ROOT, name("d"), Kind::Dir, 0o755).expect("mkdir");
        disk.create(d, name("f"), Kind::File, 0o644).expect("create");
        disk.create(ROOT, name("g"), Kind::File, 0o644).expect("create");
        assert_eq!(disk.remove(ROOT, name("d"), true), Err(libc::ENOTEMPTY));
        assert_eq!(disk.remove(ROOT, name("d"), false), Err(libc::EISDIR));
        assert_eq!(disk.rename((ROOT, name("g")), (ROOT, name("d")), false), Err(libc::EISDIR));
        assert_eq!(disk.rename((d, name("f")), (ROOT, name("g")), true), Err(libc::EEXIST));
        assert_eq!(disk.create(ROOT, name("g"), Kind::File, 0o644), Err(libc::EEXIST));
        disk.rename((d, name("f")), (ROOT, name("g")), false).expect("replace");
        disk.remove(ROOT, name("d"), true).expect("rmdir");
    }
}
