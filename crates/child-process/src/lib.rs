//! Runs a helper program of a host process (ggml-hsa's JIT kernel compiler) so that it inherits
//! nothing but its standard streams and the environment it is given, is started without copying
//! the host's address space, stops within a time limit, and cannot make the host hold more of
//! its output than a bound.
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
//! The child's environment is exactly the variables `cmd` sets (nothing of the host's is passed
//! unless the caller passes it), and its working directory is `cmd`'s. Its stdout and stderr are
//! read while it runs: at most [`Limits::output_cap`] bytes of each are kept (the head and the
//! tail, the middle counted as dropped). When [`Limits::timeout`] passes, the child is killed
//! (SIGKILL) and reported as timed out; a grandchild still holding the pipes is not waited for
//! longer than a short grace period.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a child may run and how much of its output is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Killed after this long; `None`: no limit.
    pub timeout: Option<Duration>,
    /// The most bytes kept of each of stdout and stderr.
    pub output_cap: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            timeout: None,
            output_cap: 1 << 20,
        }
    }
}

/// What a finished child left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub status: ExitStatus,
    /// Its stdout (at most [`Limits::output_cap`] bytes: the head, a marker line, the tail).
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// It ran past [`Limits::timeout`] and was killed.
    pub timed_out: bool,
}

/// Runs `cmd` (its program, arguments, environment and working directory) with stdin from
/// /dev/null and stdout and stderr captured, inheriting no other descriptor and no variable it
/// does not set, and waits for it within `limits`. Its own stdio settings are replaced by these.
pub fn output(cmd: &mut Command, limits: Limits) -> io::Result<Finished> {
    let env: Vec<(OsString, OsString)> = cmd
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
        .collect();
    match (addclosefrom(), addchdir()) {
        (Some(closefrom), chdir) if chdir.is_some() || cmd.get_current_dir().is_none() => {
            spawn_output(cmd, &env, closefrom, chdir, limits)
        }
        _ => {
            cmd.env_clear()
                .envs(env)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            inherit_only_stdio(cmd);
            let mut child = cmd.spawn()?;
            let out = child.stdout.take().map(OwnedFd::from);
            let err = child.stderr.take().map(OwnedFd::from);
            let (Some(out), Some(err)) = (out, err) else {
                return Err(io::Error::other("the child's pipes were not set up"));
            };
            collect(Running::Std(child), out, err, limits)
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

/// `posix_spawn_file_actions_addchdir_np(actions, path)`.
type AddChdir =
    unsafe extern "C" fn(*mut libc::posix_spawn_file_actions_t, *const libc::c_char) -> libc::c_int;

/// glibc's `posix_spawn_file_actions_addchdir_np` (2.29 and later), looked up at run time.
fn addchdir() -> Option<AddChdir> {
    static FOUND: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let address = *FOUND.get_or_init(|| {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads the loaded
        // objects' symbol tables.
        let p = unsafe {
            libc::dlsym(
                libc::RTLD_DEFAULT,
                c"posix_spawn_file_actions_addchdir_np".as_ptr(),
            )
        };
        (!p.is_null()).then_some(p as usize)
    });
    // SAFETY: the symbol is glibc's function of exactly this signature (posix_spawn_file_actions_t
    // pointer, NUL-terminated path; returns 0 or an error number).
    address.map(|a| unsafe { std::mem::transmute::<usize, AddChdir>(a) })
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

/// The child's environment as `KEY=value` strings.
fn environment(env: &[(OsString, OsString)]) -> io::Result<Vec<CString>> {
    env.iter()
        .map(|(k, v)| {
            let mut kv = k.clone();
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
    /// closed, the working directory changed when `chdir` is given; SIGPIPE at its default action (the host, a Rust program, ignores it, which a
    /// child would inherit) and no signal blocked, as std's Command does.
    fn new(
        out: &OwnedFd,
        err: &OwnedFd,
        closefrom: AddCloseFrom,
        chdir: Option<(AddChdir, &CString)>,
    ) -> io::Result<SpawnSetup> {
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
            if let Some((addchdir, dir)) = chdir {
                check(addchdir(fa, dir.as_ptr()))?;
            }
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
fn spawn_output(
    cmd: &Command,
    env: &[(OsString, OsString)],
    closefrom: AddCloseFrom,
    chdir: Option<AddChdir>,
    limits: Limits,
) -> io::Result<Finished> {
    let program = c_string(cmd.get_program())?;
    let mut argv: Vec<CString> = vec![program.clone()];
    for a in cmd.get_args() {
        argv.push(c_string(a)?);
    }
    let envp = environment(env)?;
    let dir = cmd
        .get_current_dir()
        .map(|d| c_string(d.as_os_str()))
        .transpose()?;
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
    let setup = SpawnSetup::new(&out_w, &err_w, closefrom, chdir.zip(dir.as_ref()))?;
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
    // The parent's write ends closed: the reads end when the child's are.
    drop((out_w, err_w));
    collect(Running::Spawned(pid), out_r, err_r, limits)
}

/// A started child, either way it was started.
enum Running {
    Spawned(libc::pid_t),
    Std(Child),
}

impl Running {
    /// Its exit status if it has ended (reaped), without waiting.
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self {
            Running::Std(child) => child.try_wait(),
            Running::Spawned(pid) => {
                let mut status: libc::c_int = 0;
                loop {
                    // SAFETY: waitpid on our own child, writing its status into a local.
                    let r = unsafe { libc::waitpid(*pid, &mut status, libc::WNOHANG) };
                    if r == *pid {
                        return Ok(Some(ExitStatus::from_raw(status)));
                    }
                    if r == 0 {
                        return Ok(None);
                    }
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
    }

    fn kill(&mut self) {
        match self {
            Running::Std(child) => {
                let _ = child.kill();
            }
            Running::Spawned(pid) => {
                // SAFETY: kill on our own child, not yet reaped (so the pid is still its).
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
        }
    }
}

/// At most `cap` bytes of a stream: the first half, then the last bytes, with a count of the
/// bytes dropped between them.
#[derive(Default)]
struct Bounded {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    dropped: u64,
    open: bool,
}

impl Bounded {
    fn push(&mut self, bytes: &[u8], cap: usize) {
        let head_room = (cap / 2).saturating_sub(self.head.len()).min(bytes.len());
        self.head.extend_from_slice(&bytes[..head_room]);
        let tail_cap = cap - cap / 2;
        for &b in &bytes[head_room..] {
            if self.tail.len() == tail_cap {
                self.tail.pop_front();
                self.dropped += 1;
            }
            if tail_cap > 0 {
                self.tail.push_back(b);
            } else {
                self.dropped += 1;
            }
        }
    }

    fn into_bytes(self) -> Vec<u8> {
        let mut out = self.head;
        if self.dropped > 0 {
            out.extend_from_slice(
                format!("\n[... {} bytes dropped ...]\n", self.dropped).as_bytes(),
            );
        }
        out.extend(self.tail);
        out
    }
}

/// How long the pipes are still read after the child ended (a grandchild may hold them).
const GRACE: Duration = Duration::from_secs(2);

/// Reads the child's two pipes until both close, keeping at most the cap of each, and reaps it;
/// kills it when the time limit passes.
fn collect(mut child: Running, out: OwnedFd, err: OwnedFd, limits: Limits) -> io::Result<Finished> {
    let started = Instant::now();
    let mut streams = [
        (
            out,
            Bounded {
                open: true,
                ..Bounded::default()
            },
        ),
        (
            err,
            Bounded {
                open: true,
                ..Bounded::default()
            },
        ),
    ];
    let mut status = None;
    let mut timed_out = false;
    let mut ended_at: Option<Instant> = None;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if status.is_none() {
            status = child.try_wait()?;
            if status.is_some() {
                ended_at = Some(Instant::now());
            }
        }
        let reading = streams.iter().any(|(_, s)| s.open);
        match (status, ended_at) {
            (Some(_), _) if !reading => break,
            (Some(_), Some(at)) if at.elapsed() > GRACE => break,
            _ => {}
        }
        if status.is_none() {
            if let Some(limit) = limits.timeout {
                if started.elapsed() > limit && !timed_out {
                    child.kill();
                    timed_out = true;
                }
            }
        }
        if !reading {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let mut fds: Vec<libc::pollfd> = streams
            .iter()
            .filter(|(_, s)| s.open)
            .map(|(fd, _)| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: poll on descriptors we own, with an array of that many entries.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 20) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for p in fds.iter().filter(|p| p.revents != 0) {
            let Some((fd, stream)) = streams.iter_mut().find(|(fd, _)| fd.as_raw_fd() == p.fd)
            else {
                continue;
            };
            // SAFETY: read into a buffer of buf.len() bytes from a descriptor we own; poll said
            // it is readable (or closed), so the read does not block.
            let got = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            match got {
                0 => stream.open = false,
                n if n > 0 => stream.push(&buf[..n as usize], limits.output_cap),
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        stream.open = false;
                    }
                }
            }
        }
    }
    let status = status.expect("the loop ends once the child is reaped");
    let [(_, out), (_, err)] = streams;
    Ok(Finished {
        status,
        stdout: out.into_bytes(),
        stderr: err.into_bytes(),
        timed_out,
    })
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

/// For the tests of callers: a connected socket as ggml-rpc makes them, without FD_CLOEXEC
/// (std sets it on its own), so a test can check that a child does not inherit it.
#[doc(hidden)]
pub fn inheritable_socket() -> io::Result<(std::net::TcpListener, std::net::TcpStream)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let stream = std::net::TcpStream::connect(listener.local_addr()?)?;
    // SAFETY: fcntl on a descriptor the stream owns and keeps open.
    if unsafe { libc::fcntl(stream.as_raw_fd(), libc::F_SETFD, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((listener, stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inheritable_socket() -> (std::net::TcpListener, std::net::TcpStream) {
        super::inheritable_socket().unwrap()
    }

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(script);
        cmd
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
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(format!(
                "test -e /proc/$$/fd/{fd} && echo open || echo closed; \
                 read line || echo stdin-empty; echo \"$CHILD_TEST\" >&2; \
                 echo \"${{HOME:+home}}\" >&2; kill -PIPE $$; echo unreachable"
            ))
            .env("CHILD_TEST", "set");
        let out = output(&mut cmd, Limits::default()).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "closed\nstdin-empty\n",
            "{out:?}"
        );
        // The variable asked for, none of the host's (HOME).
        assert!(std::env::var_os("HOME").is_some());
        assert_eq!(String::from_utf8_lossy(&out.stderr), "set\n\n");
        // SIGPIPE at its default action: the shell died of it.
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{out:?}");
        // The spawn path itself is taken wherever glibc has closefrom (Debian 12 and later).
        assert!(addclosefrom().is_some());
    }

    #[test]
    fn output_reports_a_missing_program() {
        let err = output(
            &mut Command::new("/nonexistent/compiler"),
            Limits::default(),
        )
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    }

    #[test]
    fn output_reads_large_outputs_on_both_streams() {
        let mut cmd = sh(
            "i=0; while [ $i -lt 20000 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done; exit 3",
        );
        let out = output(&mut cmd, Limits::default()).unwrap();
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

    #[test]
    fn a_child_past_its_time_limit_is_killed() {
        let limits = Limits {
            timeout: Some(Duration::from_millis(300)),
            ..Limits::default()
        };
        let started = Instant::now();
        let out = output(&mut sh("echo started; exec sleep 30"), limits).unwrap();
        assert!(out.timed_out, "{out:?}");
        assert_eq!(out.status.signal(), Some(libc::SIGKILL));
        assert_eq!(out.stdout, b"started\n");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        // A grandchild that keeps the pipes open is not waited for beyond the grace period.
        let started = Instant::now();
        let out = output(&mut sh("sleep 30 & exit 0"), Limits::default()).unwrap();
        assert!(!out.timed_out && out.status.success(), "{out:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        // Within its limit, a child is not disturbed.
        let out = output(&mut sh("exit 4"), limits).unwrap();
        assert_eq!((out.timed_out, out.status.code()), (false, Some(4)));
    }

    #[test]
    fn captured_output_is_bounded_to_its_head_and_tail() {
        let limits = Limits {
            output_cap: 1000,
            ..Limits::default()
        };
        // About 10 MB on stdout, the end of it on stderr.
        let script = "yes 0123456789abcdef | head -c 10000000; echo THE-END; echo err-end >&2";
        let out = output(&mut sh(script), limits).unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(out.stdout.len() < 1100, "{}", out.stdout.len());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("0123456789abcdef\n"), "{text}");
        assert!(text.ends_with("THE-END\n"), "{text}");
        assert!(text.contains("bytes dropped"), "{text}");
        assert_eq!(out.stderr, b"err-end\n");
    }

    #[test]
    fn the_child_runs_in_the_directory_asked_for() {
        let dir = std::env::temp_dir();
        let mut cmd = sh("pwd");
        cmd.current_dir(&dir).env("PATH", "/usr/bin:/bin");
        let out = output(&mut cmd, Limits::default()).unwrap();
        let shown = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert_eq!(
            std::fs::canonicalize(shown).unwrap(),
            std::fs::canonicalize(dir).unwrap()
        );
        assert!(addchdir().is_some());
    }
}
