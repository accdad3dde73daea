//! A lazy filesystem for power-loss tests, the kind of tool Jepsen's lazyfs is: a FUSE
//! filesystem, mounted by the test process itself, whose writes reach its backing
//! directory (the disk) only when synced; [`LazyFs::lose_power`] drops the rest, file by
//! file, so that what a server finds when it starts again is what a disk would have kept.
//!
//! The model, and when a write or a name reaches the disk, is [`disk`]'s. This file only
//! answers the kernel: every inode number is the model's, attributes and names are never
//! cached by the kernel (time-to-live zero) and files are opened with `direct_io`, so no
//! page of the kernel's own cache outlives a power loss; a power loss unmounts and mounts
//! again besides, as the reboot would.
//!
//! Needs `/dev/fuse` and root (or `fusermount3`, Debian's `fuse3`: scripts/install-deps.sh).
//! Unmounted when dropped, also when a test panics; a test process killed with -9 leaves
//! the mount behind (`umount -l` it).

mod disk;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

pub use disk::Journal;
use disk::{Disk, Ino, Kind};

/// A mounted lazy filesystem.
pub struct LazyFs {
    mountpoint: PathBuf,
    disk: Arc<Mutex<Disk>>,
    session: Option<fuser::BackgroundSession>,
    _backing: tempfile::TempDir,
}

impl LazyFs {
    /// Mounts an empty lazy filesystem on `mountpoint` (an existing, empty directory),
    /// whose disk is a new temporary directory.
    pub fn mount(mountpoint: &Path, journal: Journal) -> LazyFs {
        let backing =
            tempfile::Builder::new().prefix("pgoutbox-lazyfs-").tempdir().expect("a backing dir");
        let disk = Disk::new(backing.path().to_owned(), journal);
        let mut fs = LazyFs {
            mountpoint: mountpoint.to_owned(),
            disk: Arc::new(Mutex::new(disk)),
            session: None,
            _backing: backing,
        };
        fs.mount_again();
        fs
    }

    fn mount_again(&mut self) {
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("pgoutbox-lazyfs".to_owned()),
            fuser::MountOption::NoAtime,
        ];
        let fs = Fuse { disk: Arc::clone(&self.disk), started: SystemTime::now() };
        let session = fuser::spawn_mount(fs, &self.mountpoint, &config).unwrap_or_else(|e| {
            panic!(
                "mounting the lazy filesystem on {}: {e} (needs /dev/fuse, and root or \
                 fusermount3: scripts/install-deps.sh)",
                self.mountpoint.display()
            )
        });
        self.session = Some(session);
    }

    fn unmount(&mut self) {
        if let Some(session) = self.session.take() {
            let unmounted = session.umount_and_join();
            if unmounted.is_err() || is_mounted(&self.mountpoint) {
                // Busy: detach it, so that a test that failed leaves no mount behind.
                let path = std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes());
                if let Ok(path) = path {
                    // SAFETY: a NUL-terminated path; umount2 reads it and keeps nothing.
                    unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
                }
            }
        }
    }

    fn disk(&self) -> MutexGuard<'_, Disk> {
        self.disk.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Everything written so far reaches the disk, as a sync of every file and directory
    /// or the kernel's writeback would take it.
    pub fn write_back(&self) {
        self.disk().write_back().expect("write back to the backing directory");
    }

    /// A power loss: what was not synced is lost, file by file and name by name. Nothing
    /// may have a file of it open (kill the servers first). Returns the bytes and names lost.
    pub fn lose_power(&mut self) -> (u64, usize) {
        self.lose_power_writing_back_older_than(None)
    }

    /// The same, but what was written more than `age` ago reached the disk first, as the
    /// kernel writes back pages dirty for longer than `dirty_expire_centisecs`.
    pub fn lose_power_keeping_older_than(&mut self, age: Duration) -> (u64, usize) {
        self.lose_power_writing_back_older_than(Some(Instant::now() - age))
    }

    fn lose_power_writing_back_older_than(&mut self, moment: Option<Instant>) -> (u64, usize) {
        self.unmount();
        let lost = {
            let mut disk = self.disk();
            if let Some(moment) = moment {
                disk.write_back_older_than(moment).expect("write back to the backing dir");
            }
            disk.lose_power()
        };
        self.mount_again();
        lost
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// Whether `path` is a mount point, by /proc/self/mountinfo (field 5).
fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let path = path.to_string_lossy();
    mounts.lines().any(|line| line.split(' ').nth(4) == Some(path.as_ref()))
}

/// The filesystem as FUSE sees it.
struct Fuse {
    disk: Arc<Mutex<Disk>>,
    started: SystemTime,
}

/// Nothing cached by the kernel: each look-up and attribute comes from the model.
const TTL: Duration = Duration::ZERO;

impl Fuse {
    fn disk(&self) -> MutexGuard<'_, Disk> {
        self.disk.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn attr(&self, disk: &Disk, ino: Ino) -> Result<FileAttr, Errno> {
        let inode = disk.inode(ino).map_err(Errno::from_i32)?;
        let (kind, nlink) = match inode.kind {
            Kind::File => (FileType::RegularFile, 1),
            Kind::Dir => (FileType::Directory, 2),
        };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size: inode.size,
            blocks: inode.size.div_ceil(512),
            atime: inode.mtime,
            mtime: inode.mtime,
            ctime: inode.mtime,
            crtime: self.started,
            kind,
            perm: inode.perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn entry(&self, reply: ReplyEntry, found: Result<Ino, i32>) {
        let disk = self.disk();
        match found.map_err(Errno::from_i32).and_then(|ino| self.attr(&disk, ino)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }
}

fn done(reply: ReplyEmpty, result: Result<(), i32>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(Errno::from_i32(e)),
    }
}

fn perm(mode: u32, umask: u32) -> u16 {
    (mode & !umask & 0o7777) as u16
}

impl fuser::Filesystem for Fuse {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.disk().lookup(parent.0, name);
        self.entry(reply, found);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let disk = self.disk();
        match self.attr(&disk, ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut disk = self.disk();
        let mut result = Ok(());
        if let Some(size) = size {
            result = disk.set_len(ino.0, size);
        }
        if let (Some(mode), Ok(())) = (mode, result) {
            result = disk.set_perm(ino.0, perm(mode, 0));
        }
        match result.map_err(Errno::from_i32).and_then(|()| self.attr(&disk, ino.0)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let made = self.disk().create(parent.0, name, Kind::File, perm(mode, umask));
        self.entry(reply, made);
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let made = self.disk().create(parent.0, name, Kind::Dir, perm(mode, umask));
        self.entry(reply, made);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(reply, self.disk().remove(parent.0, name, false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(reply, self.disk().remove(parent.0, name, true));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(!RenameFlags::RENAME_NOREPLACE) {
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        done(reply, self.disk().rename((parent.0, name), (newparent.0, newname), noreplace));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_TRUNC != 0
            && let Err(e) = self.disk().set_len(ino.0, 0)
        {
            return reply.error(Errno::from_i32(e));
        }
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut disk = self.disk();
        let made = disk.create(parent.0, name, Kind::File, perm(mode, umask));
        match made.map_err(Errno::from_i32).and_then(|ino| self.attr(&disk, ino)) {
            Ok(attr) => {
                let direct = FopenFlags::FOPEN_DIRECT_IO;
                reply.created(&TTL, &attr, Generation(0), FileHandle(0), direct);
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.disk().read(ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.disk().write(ino.0, offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        done(reply, self.disk().fsync(ino.0));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.disk().entries(ino.0) {
            Ok(entries) => entries,
            Err(e) => return reply.error(Errno::from_i32(e)),
        };
        let dots = [(".".into(), ino.0, Kind::Dir), ("..".into(), ino.0, Kind::Dir)];
        let all = dots.into_iter().chain(entries);
        for (i, (name, ino, kind)) in all.enumerate().skip(offset as usize) {
            let kind = match kind {
                Kind::File => FileType::RegularFile,
                Kind::Dir => FileType::Directory,
            };
            if reply.add(INodeNo(ino), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        done(reply, self.disk().fsync(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Plenty of room: JetStream sizes its store by the space it sees.
        reply.statfs(1 << 28, 1 << 27, 1 << 27, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// Through the kernel: a synced file keeps its contents, a write after the sync and a
    /// file never synced are lost; the mount is gone once dropped.
    #[test]
    fn a_mounted_lazy_filesystem_loses_what_was_not_synced() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut fs = LazyFs::mount(dir.path(), Journal::Ordered);
        std::fs::create_dir(dir.path().join("msgs")).expect("mkdir");
        let mut synced = std::fs::File::create(dir.path().join("msgs/1.blk")).expect("create");
        synced.write_all(b"synced").expect("write");
        std::fs::write(dir.path().join("msgs/index.db"), b"never synced").expect("write");
        synced.sync_all().expect("fsync: the journal, with every name, too");
        synced.write_all(b" and not").expect("write");
        drop(synced);
        let read = |name: &str| std::fs::read(dir.path().join(name));
        assert_eq!(read("msgs/1.blk").expect("read"), b"synced and not");
        assert_eq!(fs.lose_power(), (20, 0));
        assert_eq!(read("msgs/1.blk").expect("read"), b"synced");
        assert_eq!(read("msgs/index.db").expect("its name reached the disk"), b"");
        std::fs::write(dir.path().join("msgs/2.blk"), b"after").expect("write");
        fs.write_back();
        std::fs::write(dir.path().join("msgs/3.blk"), b"lost").expect("write");
        fs.lose_power();
        assert_eq!(read("msgs/2.blk").expect("written back"), b"after");
        assert!(read("msgs/3.blk").is_err(), "a name never synced");
        drop(fs);
        assert!(!is_mounted(dir.path()), "still mounted");
    }
}
