//! Child processes of the backend (the JIT kernel compiler) that inherit nothing but their
//! standard streams, started without copying the host's address space.
//!
//! The host process may hold descriptors without `FD_CLOEXEC`: ggml-rpc's sockets, for one (it
//! creates them with plain `socket`/`accept`). A compiler started inside `ggml-rpc-server` would
//! inherit the client's socket and keep it open after the server died, so the client would wait
//! for the compiler instead of seeing the connection close.
//!
//! std's `Command` can only close them from a `pre_exec` hook, which makes it `fork` the host:
//! a host holding many GiB (a model's weights, the NPU's buffers) then needs as much again
//! accounted or copied page tables, and `fork` fails with ENOMEM when memory is short, so no
//! kernel could be compiled from then on. [`output`] starts the child with `posix_spawn` (the
//! child shares the parent's memory until it executes) and glibc's
//! `posix_spawn_file_actions_addclosefrom_np` (2.34 and later, looked up at run time) instead;
//! without that function it falls back to `Command` with the hook.
//!
//! This module is under `src/hsa` only because that is where the crate allows unsafe code; it
//! does not touch the HSA runtime.

use std::ffi::{CString, OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Output, Stdio};

/// Runs `cmd` (its program, arguments and environment changes; no working directory) with
/// stdin from /dev/null and stdout and stderr captured, inheriting no other descriptor, and
/// waits for it. Its own stdio settings are replaced by these.
pub fn output(cmd: &mut Command) -> io::Result<Output> {
    match addclosefrom() {
        Some(closefrom) if cmd.get_current_dir().is_none() => spawn_output(cmd, closefrom),
        _ => {
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            inherit_only_stdio(cmd);
            cmd.output()
        }
    }
}

/// `posix_spawn_file_actions_addclosefrom_np(actions, from)`.
type AddCloseFrom =
    unsafe extern "C" fn(*mut libc::posix_spawn_file_actions_t, libc::c_int) -> libc::c_int;

/// glibc's `posix_spawn_file_actions_addclosefrom_np`, when the C library has it: looked up at
/// run time so that the plugin still loads with an older glibc.
fn addclosefrom() -> Option<AddCloseFrom> {
    static FOUND: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let address = *FOUND.get_or_init(|| {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads the loaded
        // objects' symbol tables.
        let p = unsafe {
            libc::dlsym(
                libc::RTLD_DEFAULT,
                c"posix_spawn_file_actions_addclosefrom_np".as_ptr(),
            )
        };
        (!p.is_null()).then_some(p as usize)
    });
    // SAFETY: the symbol is glibc's function of exactly this signature (posix_spawn_file_actions_t
    // pointer, int from; returns 0 or an error number).
    address.map(|a| unsafe { std::mem::transmute::<usize, AddCloseFrom>(a) })
}

/// A NUL-terminated copy of `s`; an interior NUL (which no exec could pass) is an error.
fn c_string(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{s:?} contains a NUL byte"),
        )
    })
}

/// The child's environment: the host's with `cmd`'s changes, as `KEY=value` strings.
fn environment(cmd: &Command) -> io::Result<Vec<CString>> {
    let mut vars: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (key, value) in cmd.get_envs() {
        vars.retain(|(k, _)| k != key);
        if let Some(value) = value {
            vars.push((key.to_owned(), value.to_owned()));
        }
    }
    vars.into_iter()
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            c_string(&kv)
        })
        .collect()
}

/// A pipe whose both ends are close-on-exec: (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Turns a posix_spawn* return value (0 or an error number) into a result.
fn check(code: libc::c_int) -> io::Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(code))
    }
}

/// The spawn's file actions and attributes, destroyed when dropped.
struct SpawnSetup {
    actions: libc::posix_spawn_file_actions_t,
    attr: libc::posix_spawnattr_t,
}

impl Drop for SpawnSetup {
    fn drop(&mut self) {
        // SAFETY: both were initialised by SpawnSetup::new and are destroyed once, here.
        unsafe {
            libc::posix_spawn_file_actions_destroy(&mut self.actions);
            libc::posix_spawnattr_destroy(&mut self.attr);
        }
    }
}

impl SpawnSetup {
    /// stdin from /dev/null, stdout and stderr onto `out` and `err`, every descriptor from 3
    /// closed; SIGPIPE at its default action (the host, a Rust program, ignores it, which a
    /// child would inherit) and no signal blocked, as std's Command does.
    fn new(out: &OwnedFd, err: &OwnedFd, closefrom: AddCloseFrom) -> io::Result<SpawnSetup> {
        use std::os::fd::AsRawFd;
        // Each is initialised by its *_init call before any other use and destroyed only if
        // that succeeded (Drop runs only once both are). glibc's structs hold counts, flags and
        // a heap pointer, nothing that refers to their own address, so they may move.
        // SAFETY: all-zero bytes are a valid placeholder for this plain C struct.
        let mut actions: libc::posix_spawn_file_actions_t = unsafe { std::mem::zeroed() };
        // SAFETY: init on a local struct we own.
        check(unsafe { libc::posix_spawn_file_actions_init(&mut actions) })?;
        // SAFETY: all-zero bytes are a valid placeholder for this plain C struct.
        let mut attr: libc::posix_spawnattr_t = unsafe { std::mem::zeroed() };
        // SAFETY: init on a local struct we own.
        if let Err(e) = check(unsafe { libc::posix_spawnattr_init(&mut attr) }) {
            // SAFETY: initialised above, destroyed once.
            unsafe { libc::posix_spawn_file_actions_destroy(&mut actions) };
            return Err(e);
        }
        let mut setup = SpawnSetup { actions, attr };
        let devnull = c"/dev/null";
        // SAFETY: the file actions and attributes were initialised above; the descriptors are
        // open for the whole spawn; the signal sets are local and initialised by sigemptyset.
        unsafe {
            let fa: *mut libc::posix_spawn_file_actions_t = &mut setup.actions;
            check(libc::posix_spawn_file_actions_addopen(
                fa,
                0,
                devnull.as_ptr(),
                libc::O_RDONLY,
                0,
            ))?;
            check(libc::posix_spawn_file_actions_adddup2(
                fa,
                out.as_raw_fd(),
                1,
            ))?;
            check(libc::posix_spawn_file_actions_adddup2(
                fa,
                err.as_raw_fd(),
                2,
            ))?;
            check(closefrom(fa, 3))?;
            let mut default: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut default);
            libc::sigaddset(&mut default, libc::SIGPIPE);
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            check(libc::posix_spawnattr_setsigdefault(
                &mut setup.attr,
                &default,
            ))?;
            check(libc::posix_spawnattr_setsigmask(&mut setup.attr, &none))?;
            let flags = libc::POSIX_SPAWN_SETSIGDEF | libc::POSIX_SPAWN_SETSIGMASK;
            check(libc::posix_spawnattr_setflags(
                &mut setup.attr,
                flags as libc::c_short,
            ))?;
        }
        Ok(setup)
    }
}

/// [`output`] through posix_spawn.
fn spawn_output(cmd: &Command, closefrom: AddCloseFrom) -> io::Result<Output> {
    let program = c_string(cmd.get_program())?;
    let mut argv: Vec<CString> = vec![program.clone()];
    for a in cmd.get_args() {
        argv.push(c_string(a)?);
    }
    let envp = environment(cmd)?;
    let argv_ptrs: Vec<*mut libc::c_char> = argv
        .iter()
        .map(|a| a.as_ptr().cast_mut())
        .chain([std::ptr::null_mut()])
        .collect();
    let envp_ptrs: Vec<*mut libc::c_char> = envp
        .iter()
        .map(|e| e.as_ptr().cast_mut())
        .chain([std::ptr::null_mut()])
        .collect();
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let setup = SpawnSetup::new(&out_w, &err_w, closefrom)?;
    let mut pid: libc::pid_t = 0;
    // SAFETY: every pointer is valid for the call: the NUL-terminated strings and the
    // NULL-terminated pointer arrays outlive it, the file actions and attributes were
    // initialised by SpawnSetup::new. posix_spawnp (searching PATH like Command) does not keep
    // any of them after it returns.
    check(unsafe {
        libc::posix_spawnp(
            &mut pid,
            program.as_ptr(),
            &setup.actions,
            &setup.attr,
            argv_ptrs.as_ptr(),
            envp_ptrs.as_ptr(),
        )
    })?;
    drop(setup);
    // The parent's write ends closed: the reads below end when the child's are.
    drop((out_w, err_w));
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let (out_read, err_read) = std::thread::scope(|scope| {
        let err_reader = scope.spawn(|| std::fs::File::from(err_r).read_to_end(&mut stderr));
        let out_read = std::fs::File::from(out_r).read_to_end(&mut stdout);
        (out_read, err_reader.join())
    });
    let status = wait(pid)?;
    out_read?;
    err_read.map_err(|_| io::Error::other("the stderr reader panicked"))??;
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// Waits for child `pid` to end (retrying when a signal interrupts the wait).
fn wait(pid: libc::pid_t) -> io::Result<ExitStatus> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: waitpid on our own child, writing its status into a local.
        if unsafe { libc::waitpid(pid, &mut status, 0) } == pid {
            return Ok(ExitStatus::from_raw(status));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Marks every descriptor from 3 up close-on-exec in the child `cmd` starts, after its standard
/// streams are set up and before it executes the program, so that the program inherits only
/// stdin, stdout and stderr. The parent's descriptors are not changed.
pub fn inherit_only_stdio(cmd: &mut Command) {
    // Computed here, in the parent: the hook runs between fork and exec, where only
    // async-signal-safe calls are allowed (no allocation, no /proc reading).
    let limit = open_files_limit();
    // SAFETY: the hook makes only async-signal-safe system calls (close_range, fcntl) on the
    // child's own descriptor table and touches no memory shared with other threads. Marking
    // std's error pipe close-on-exec is harmless: it already is.
    unsafe {
        cmd.pre_exec(move || {
            mark_cloexec_from_3(limit);
            Ok(())
        });
    }
}

/// The process's descriptor limit (RLIMIT_NOFILE), for the fallback loop.
fn open_files_limit() -> libc::c_int {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we pass.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0;
    if ok {
        // Bounded: an unlimited soft limit would make the fallback loop endless.
        rl.rlim_cur.min(1 << 20) as libc::c_int
    } else {
        1024
    }
}

/// `close_range(3, ~0, CLOSE_RANGE_CLOEXEC)` (Linux 5.11), else `FD_CLOEXEC` on each
/// descriptor below `limit` (an EBADF for the ones not open is expected and ignored).
fn mark_cloexec_from_3(limit: libc::c_int) {
    // SAFETY: a raw system call with integer arguments; it only changes descriptor flags.
    let done = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    } == 0;
    if !done {
        for fd in 3..limit {
            // SAFETY: fcntl on an integer descriptor; a descriptor not open gives EBADF.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    /// A connected socket as ggml-rpc makes them: without FD_CLOEXEC (std sets it on its own).
    pub(crate) fn inheritable_socket() -> (TcpListener, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        // SAFETY: fcntl on a descriptor the stream owns and keeps open for the test.
        let cleared = unsafe { libc::fcntl(stream.as_raw_fd(), libc::F_SETFD, 0) };
        assert_eq!(cleared, 0);
        (listener, stream)
    }

    /// Whether a shell started by `cmd` has descriptor `fd` open.
    fn child_has(mut cmd: Command, fd: i32) -> bool {
        let out = cmd
            .arg("-c")
            .arg(format!(
                "test -e /proc/$$/fd/{fd} && echo open || echo closed"
            ))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "open"
    }

    #[test]
    fn a_child_does_not_inherit_the_hosts_sockets() {
        let (_listener, stream) = inheritable_socket();
        let fd = stream.as_raw_fd();
        // The premise: a plain spawn hands the socket to the child.
        assert!(child_has(Command::new("sh"), fd));
        let mut cmd = Command::new("sh");
        inherit_only_stdio(&mut cmd);
        assert!(!child_has(cmd, fd));
        // The parent's descriptor is unchanged (still inheritable).
        assert!(child_has(Command::new("sh"), fd));
    }

    #[test]
    fn output_gives_the_child_only_its_streams_and_the_environment_asked_for() {
        let (_listener, stream) = inheritable_socket();
        let fd = stream.as_raw_fd();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "test -e /proc/$$/fd/{fd} && echo open || echo closed; \
                 read line || echo stdin-empty; echo \"$CHILD_TEST\" >&2; \
                 echo \"${{HOME:+home}}\" >&2; kill -PIPE $$; echo unreachable"
            ))
            .env("CHILD_TEST", "set");
        let out = output(&mut cmd).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "closed\nstdin-empty\n",
            "{out:?}"
        );
        // The variable asked for, the host's others (HOME) inherited.
        assert_eq!(String::from_utf8_lossy(&out.stderr), "set\nhome\n");
        // SIGPIPE at its default action: the shell died of it.
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{out:?}");
        // The spawn path itself is taken wherever glibc has closefrom (Debian 12 and later).
        assert!(addclosefrom().is_some());
    }

    #[test]
    fn output_reports_a_missing_program() {
        let err = output(&mut Command::new("/nonexistent/compiler")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    }

    #[test]
    fn output_reads_large_outputs_on_both_streams() {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(
            "i=0; while [ $i -lt 20000 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done; exit 3",
        );
        let out = output(&mut cmd).unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 20000);
        assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 20000);
    }

    #[test]
    fn the_fallback_loop_marks_the_same_descriptors() {
        let (_listener, stream) = inheritable_socket();
        let fd = stream.as_raw_fd();
        let limit = open_files_limit();
        assert!(limit > fd, "{limit}");
        let mut cmd = Command::new("sh");
        // SAFETY: as in inherit_only_stdio, the loop alone (the path of kernels before 5.11).
        unsafe {
            cmd.pre_exec(move || {
                for fd in 3..limit {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
                Ok(())
            });
        }
        assert!(!child_has(cmd, fd));
    }
}
