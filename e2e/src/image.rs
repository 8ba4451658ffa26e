//! Container images without Docker or a registry: reads one image's target stage of `docker/Dockerfile`,
//! carries out its instructions on binaries built by cargo (an OCI layout made with `umoci`), and
//! checks an assembled image against what its Dockerfile declares, so the two cannot drift apart.
//!
//! An image's stage (`FROM … AS <target>`, up to the next `FROM`) may hold only `FROM` (the distroless base, emulated: its users, `/tmp`, CA bundle and
//! the shared libraries each binary links), `COPY --from=<stage> /out/<binary>`, `COPY [--chown] <dir>`
//! from the build context, `WORKDIR`, `USER` and `ENTRYPOINT`; anything else is an error naming the line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The base image every image's stage must use (its content is emulated, see [`write_base`]).
pub const BASE_IMAGE: &str = "gcr.io/distroless/cc-debian12:nonroot";
/// distroless's `nonroot` user and group.
pub const NONROOT: u32 = 65532;
/// The PATH distroless sets.
const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The CA bundle distroless carries and names in SSL_CERT_FILE.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Errors reading a Dockerfile or assembling an image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{file}:{line}: {problem}")]
    Dockerfile {
        file: String,
        line: usize,
        problem: String,
    },
    #[error("{0}: io: {1}")]
    Io(String, std::io::Error),
    #[error("`{command}` failed: {stderr}")]
    Tool { command: String, stderr: String },
    #[error("image {image}: {problem}")]
    Layout { image: String, problem: String },
}

/// One file or directory an image's stage copies into the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `COPY --from=<stage> /out/<name> <dest>`: a binary the build stage made (cargo's `<name>`).
    Built(String),
    /// `COPY <path> <dest>`: a path of the build context (the repository root).
    Context(PathBuf),
}

/// A `COPY` of an image's stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    pub source: Source,
    pub dest: String,
    /// `--chown=uid:gid`.
    pub chown: Option<(u32, u32)>,
}

/// What an image's target stage of a Dockerfile declares.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TargetStage {
    pub base: String,
    pub copies: Vec<Copy>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
}

/// Parses the stage named `target` (from its `FROM … AS target` up to the next `FROM`) of a Dockerfile's text.
pub fn parse_target_stage(file: &str, text: &str, target: &str) -> Result<TargetStage, ImageError> {
    let err = |line: usize, problem: String| ImageError::Dockerfile {
        file: file.to_string(),
        line,
        problem,
    };
    let lines = logical_lines(text);
    let names_target = |line: &str| {
        let words: Vec<&str> = line.split_whitespace().collect();
        keyword(line) == "FROM"
            && words.len() == 4
            && words[2].eq_ignore_ascii_case("AS")
            && words[3] == target
    };
    let start = lines
        .iter()
        .position(|(_, l)| names_target(l))
        .ok_or_else(|| err(0, format!("no stage `FROM … AS {target}`")))?;
    let end = lines[start + 1..]
        .iter()
        .position(|(_, l)| keyword(l) == "FROM")
        .map_or(lines.len(), |i| start + 1 + i);
    let mut stage = TargetStage::default();
    for (number, line) in &lines[start..end] {
        let (word, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let rest = rest.trim();
        match word.to_ascii_uppercase().as_str() {
            "FROM" => stage.base = rest.split_whitespace().next().unwrap_or("").to_string(),
            "COPY" => stage
                .copies
                .push(parse_copy(rest).map_err(|p| err(*number, p))?),
            "WORKDIR" => stage.workdir = Some(rest.to_string()),
            "USER" => stage.user = Some(rest.to_string()),
            "ENTRYPOINT" => {
                stage.entrypoint = serde_json::from_str(rest).map_err(|e| {
                    err(
                        *number,
                        format!("ENTRYPOINT must be a JSON array (exec form): {e}"),
                    )
                })?
            }
            other => {
                return Err(err(
                    *number,
                    format!(
                        "the stage {target} may not use {other}: e2e/src/image.rs assembles images without Docker and knows only FROM, COPY, WORKDIR, USER and ENTRYPOINT there; teach it the new instruction"
                    ),
                ));
            }
        }
    }
    if stage.base != BASE_IMAGE {
        return Err(err(
            lines[start].0,
            format!(
                "the stage {target} must be FROM {BASE_IMAGE} (emulated here), not {}",
                stage.base
            ),
        ));
    }
    if stage.entrypoint.is_empty() {
        return Err(err(0, format!("the stage {target} has no ENTRYPOINT")));
    }
    Ok(stage)
}

/// Lines without comments and blank lines, with `\` continuations joined; each with its 1-based number.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if pending.is_none() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        let (number, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        if let Some(head) = line.strip_suffix('\\') {
            joined.push_str(head);
            joined.push(' ');
            pending = Some((number, joined));
        } else {
            joined.push_str(line);
            out.push((number, joined));
        }
    }
    out.extend(pending);
    out
}

fn keyword(line: &str) -> String {
    line.split_whitespace()
        .next()
        .unwrap_or("")
        .to_ascii_uppercase()
}

fn parse_copy(rest: &str) -> Result<Copy, String> {
    let mut from = None;
    let mut chown = None;
    let mut paths = Vec::new();
    for word in rest.split_whitespace() {
        if let Some(stage) = word.strip_prefix("--from=") {
            from = Some(stage.to_string());
        } else if let Some(owner) = word.strip_prefix("--chown=") {
            let (u, g) = owner
                .split_once(':')
                .ok_or_else(|| format!("--chown={owner}: expected numeric uid:gid"))?;
            let num = |s: &str| {
                s.parse::<u32>()
                    .map_err(|_| format!("--chown={owner}: expected numeric uid:gid"))
            };
            chown = Some((num(u)?, num(g)?));
        } else if word.starts_with("--") {
            return Err(format!("COPY option {word} is not supported here"));
        } else {
            paths.push(word.to_string());
        }
    }
    let [src, dest] = <[String; 2]>::try_from(paths)
        .map_err(|p| format!("COPY needs exactly one source and one destination, got {p:?}"))?;
    let source = match from {
        Some(_) => Source::Built(
            src.strip_prefix("/out/")
                .ok_or_else(|| {
                    format!("COPY --from copies a binary from /out/ of the build stage, not {src}")
                })?
                .to_string(),
        ),
        None => Source::Context(PathBuf::from(src)),
    };
    Ok(Copy {
        source,
        dest,
        chown,
    })
}

/// Where the inputs of an image come from.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The build context (the repository root).
    pub context: PathBuf,
    /// Where cargo put the binaries (`target/debug` or `target/release`).
    pub binaries: PathBuf,
}

/// An assembled image: an OCI layout directory and a tar of it (what `ctr images import` reads).
#[derive(Debug, Clone)]
pub struct Assembled {
    pub layout: PathBuf,
    pub tag: String,
    pub tar: PathBuf,
    pub stage: TargetStage,
}

/// Assembles the image of `dockerfile` as `out/<name>-layout:<tag>` with umoci.
pub fn assemble(
    dockerfile: &Path,
    target: &str,
    name: &str,
    tag: &str,
    inputs: &Inputs,
    out: &Path,
) -> Result<Assembled, ImageError> {
    let text = read(dockerfile)?;
    let stage = parse_target_stage(&dockerfile.display().to_string(), &text, target)?;
    let config = OciConfig {
        user: stage.user.clone(),
        workdir: stage.workdir.clone(),
        entrypoint: stage.entrypoint.clone(),
        env: vec![
            format!("PATH={BASE_PATH}"),
            format!("SSL_CERT_FILE={CA_BUNDLE}"),
        ],
    };
    let (layout, tar) = package(out, name, tag, &config, |rootfs| {
        let mut elves = Vec::new();
        for copy in &stage.copies {
            let dest = rootfs.join(copy.dest.trim_start_matches('/'));
            match &copy.source {
                Source::Built(name) => {
                    let from = inputs.binaries.join(name);
                    copy_path(&from, &dest)?;
                    elves.push(from);
                }
                Source::Context(path) => copy_path(&inputs.context.join(path), &dest)?,
            }
            if let Some((uid, gid)) = copy.chown {
                chown_tree(&dest, uid, gid)?;
            }
        }
        write_base(rootfs, &elves)?;
        if let Some(dir) = &stage.workdir {
            let path = rootfs.join(dir.trim_start_matches('/'));
            std::fs::create_dir_all(&path).map_err(|e| io(&path, e))?;
        }
        Ok(())
    })?;
    Ok(Assembled {
        layout,
        tag: tag.to_string(),
        tar,
        stage,
    })
}

/// The sandbox ("pause") image, tagged `tag`: Kubernetes' static pause binary as `/pause`, run as 65535 as
/// upstream's is.
pub fn pause_image(pause: &Path, tag: &str, out: &Path) -> Result<PathBuf, ImageError> {
    let config = OciConfig {
        user: Some("65535:65535".into()),
        workdir: None,
        entrypoint: vec!["/pause".into()],
        env: Vec::new(),
    };
    let (_, tar) = package(out, "pause", tag, &config, |rootfs| {
        copy_path(pause, &rootfs.join("pause"))
    })?;
    Ok(tar)
}

/// The runtime settings of an image.
#[derive(Debug, Clone, Default)]
pub struct OciConfig {
    pub user: Option<String>,
    pub workdir: Option<String>,
    pub entrypoint: Vec<String>,
    pub env: Vec<String>,
}

/// Makes a one-layer OCI image `out/<name>-layout:<tag>` whose root filesystem `fill` writes, and a tar
/// of the layout. Returns (layout, tar).
fn package(
    out: &Path,
    name: &str,
    tag: &str,
    config: &OciConfig,
    fill: impl FnOnce(&Path) -> Result<(), ImageError>,
) -> Result<(PathBuf, PathBuf), ImageError> {
    let layout = out.join(format!("{name}-layout"));
    let bundle = out.join(format!("{name}-bundle"));
    let image = format!("{}:{tag}", layout.display());
    let _ = std::fs::remove_dir_all(&layout);
    let _ = std::fs::remove_dir_all(&bundle);
    umoci(&["init", "--layout", &layout.display().to_string()])?;
    umoci(&["new", "--image", &image])?;
    umoci(&["unpack", "--image", &image, &bundle.display().to_string()])?;
    fill(&bundle.join("rootfs"))?;
    umoci(&["repack", "--image", &image, &bundle.display().to_string()])?;
    let mut args = vec!["config".to_string(), "--image".into(), image.clone()];
    for env in &config.env {
        args.extend(["--config.env".into(), env.clone()]);
    }
    if let Some(user) = &config.user {
        args.extend(["--config.user".into(), user.clone()]);
    }
    if let Some(dir) = &config.workdir {
        args.extend(["--config.workingdir".into(), dir.clone()]);
    }
    for arg in &config.entrypoint {
        args.extend(["--config.entrypoint".into(), arg.clone()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    umoci(&args)?;
    umoci(&["gc", "--layout", &layout.display().to_string()])?;
    let _ = std::fs::remove_dir_all(&bundle);
    let tar = out.join(format!("{name}.tar"));
    run(Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&tar)
        .arg("."))?;
    Ok((layout, tar))
}

/// The distroless base, emulated: `/etc/passwd` and `/etc/group` with root, nobody and nonroot (65532),
/// `/tmp`, `/home/nonroot`, the host's CA bundle, and every shared library the binaries link (with the
/// dynamic loader), from the host (Debian 12 here, the base's own distribution).
fn write_base(rootfs: &Path, elves: &[PathBuf]) -> Result<(), ImageError> {
    let etc = rootfs.join("etc");
    std::fs::create_dir_all(&etc).map_err(|e| io(&etc, e))?;
    write(
        &etc.join("passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )?;
    write(
        &etc.join("group"),
        "root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n",
    )?;
    write(
        &etc.join("nsswitch.conf"),
        "passwd: files\ngroup: files\nhosts: files dns\n",
    )?;
    let tmp = rootfs.join("tmp");
    std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    set_mode(&tmp, 0o1777)?;
    let home = rootfs.join("home/nonroot");
    std::fs::create_dir_all(&home).map_err(|e| io(&home, e))?;
    chown_tree(&home, NONROOT, NONROOT)?;
    if Path::new(CA_BUNDLE).is_file() {
        copy_path(
            Path::new(CA_BUNDLE),
            &rootfs.join(CA_BUNDLE.trim_start_matches('/')),
        )?;
    }
    let mut libraries = BTreeMap::new();
    for elf in elves {
        for lib in linked_libraries(elf)? {
            libraries.insert(lib.clone(), lib);
        }
    }
    for lib in libraries.values() {
        let real = std::fs::canonicalize(lib).map_err(|e| io(lib, e))?;
        copy_path(&real, &rootfs.join(lib.strip_prefix("/").unwrap_or(lib)))?;
    }
    Ok(())
}

/// The absolute paths of the shared libraries and loader an ELF binary needs (`ldd`).
fn linked_libraries(elf: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let out = run(Command::new("ldd").arg(elf))?;
    Ok(out
        .lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// What an assembled image holds, read back from its OCI layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFacts {
    pub user: String,
    pub entrypoint: Vec<String>,
    pub workdir: String,
    /// Every path in the layer (without a leading `./` or `/`) with its uid:gid.
    pub owners: BTreeMap<String, (u32, u32)>,
}

/// Reads the config and the layer listing of `layout:tag`.
pub fn inspect(layout: &Path, tag: &str) -> Result<ImageFacts, ImageError> {
    let bad = |problem: String| ImageError::Layout {
        image: format!("{}:{tag}", layout.display()),
        problem,
    };
    let json = |path: PathBuf| -> Result<serde_json::Value, ImageError> {
        serde_json::from_str(&read(&path)?).map_err(|e| bad(format!("{}: {e}", path.display())))
    };
    let blob = |digest: &str| layout.join("blobs").join(digest.replacen(':', "/", 1));
    let index = json(layout.join("index.json"))?;
    let manifest = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .ok_or_else(|| bad("no manifest with that tag in index.json".into()))?;
    let manifest = json(blob(manifest["digest"].as_str().unwrap_or_default()))?;
    let config = json(blob(
        manifest["config"]["digest"].as_str().unwrap_or_default(),
    ))?;
    let c = &config["config"];
    let mut owners = BTreeMap::new();
    for layer in manifest["layers"].as_array().into_iter().flatten() {
        let path = blob(layer["digest"].as_str().unwrap_or_default());
        let listing = run(Command::new("tar")
            .arg("--numeric-owner")
            .arg("-tvzf")
            .arg(&path))?;
        for line in listing.lines() {
            // -rwxr-xr-x 0/0 123 2026-11-23 20:00 ./usr/local/bin/x
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(owner), Some(name)) = (fields.get(1), fields.get(5)) else {
                continue;
            };
            let Some((u, g)) = owner.split_once('/') else {
                continue;
            };
            let name = name.trim_start_matches("./").trim_start_matches('/');
            let name = name.trim_end_matches('/').to_string();
            if let (Ok(u), Ok(g)) = (u.parse(), g.parse()) {
                owners.insert(name, (u, g));
            }
        }
    }
    Ok(ImageFacts {
        user: c["User"].as_str().unwrap_or_default().to_string(),
        entrypoint: c["Entrypoint"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        workdir: c["WorkingDir"].as_str().unwrap_or_default().to_string(),
        owners,
    })
}

/// Differences between what an image's stage of a Dockerfile declares and what an image holds (empty: none).
pub fn drift(stage: &TargetStage, facts: &ImageFacts) -> Vec<String> {
    let mut problems = Vec::new();
    if stage.user.as_deref().unwrap_or_default() != facts.user {
        problems.push(format!(
            "USER {:?} but the image runs as {:?}",
            stage.user, facts.user
        ));
    }
    if stage.entrypoint != facts.entrypoint {
        problems.push(format!(
            "ENTRYPOINT {:?} but the image's is {:?}",
            stage.entrypoint, facts.entrypoint
        ));
    }
    if stage.workdir.as_deref().unwrap_or_default() != facts.workdir {
        problems.push(format!(
            "WORKDIR {:?} but the image's is {:?}",
            stage.workdir, facts.workdir
        ));
    }
    for copy in &stage.copies {
        let dest = copy.dest.trim_start_matches('/').trim_end_matches('/');
        match facts.owners.get(dest) {
            None => problems.push(format!("COPY to {} but the image has no {dest}", copy.dest)),
            Some(&owner) => {
                let want = copy.chown.unwrap_or((0, 0));
                if owner != want {
                    problems.push(format!(
                        "{dest} is owned by {owner:?}, the Dockerfile says {want:?}"
                    ));
                }
                let below = facts
                    .owners
                    .iter()
                    .filter(|(p, _)| p.starts_with(&format!("{dest}/")))
                    .find(|&(_, &o)| o != want);
                if let Some((path, o)) = below {
                    problems.push(format!(
                        "{path} is owned by {o:?}, the Dockerfile says {want:?}"
                    ));
                }
            }
        }
    }
    for entry in &stage.entrypoint[..1] {
        if !facts.owners.contains_key(entry.trim_start_matches('/')) {
            problems.push(format!("the entrypoint {entry} is not in the image"));
        }
    }
    problems
}

fn umoci(args: &[&str]) -> Result<String, ImageError> {
    run(Command::new("umoci").args(args))
}

fn run(command: &mut Command) -> Result<String, ImageError> {
    let text = format!("{command:?}");
    let out = command.output().map_err(|e| ImageError::Tool {
        command: text.clone(),
        stderr: format!(
            "cannot start it ({e}); install umoci, tar and ldd (apt-get install umoci)"
        ),
    })?;
    if !out.status.success() {
        return Err(ImageError::Tool {
            command: text,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn io(path: &Path, e: std::io::Error) -> ImageError {
    ImageError::Io(path.display().to_string(), e)
}

fn read(path: &Path) -> Result<String, ImageError> {
    std::fs::read_to_string(path).map_err(|e| io(path, e))
}

fn write(path: &Path, text: &str) -> Result<(), ImageError> {
    std::fs::write(path, text).map_err(|e| io(path, e))
}

fn set_mode(path: &Path, mode: u32) -> Result<(), ImageError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| io(path, e))
}

/// Copies a file or a directory tree (`cp -a` keeps modes; a file's parent directories are made).
fn copy_path(from: &Path, to: &Path) -> Result<(), ImageError> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    }
    run(Command::new("cp").arg("-a").arg("-T").arg(from).arg(to)).map(|_| ())
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> Result<(), ImageError> {
    run(Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(path))
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dockerfile(target: &str) -> TargetStage {
        let path = crate::tools::workspace_root().join("docker/Dockerfile");
        parse_target_stage(
            "Dockerfile",
            &std::fs::read_to_string(path).unwrap(),
            target,
        )
        .unwrap()
    }

    #[test]
    fn the_three_images_of_the_dockerfile_are_understood() {
        for (file, binary) in [
            ("operator", "rdu-operator"),
            ("device-plugin", "rdu-device-plugin"),
            ("worker", "rdu-worker"),
        ] {
            let stage = dockerfile(file);
            assert_eq!(stage.user.as_deref(), Some("65532:65532"), "{file}");
            let path = format!("/usr/local/bin/{binary}");
            assert_eq!(stage.entrypoint, vec![path.clone()], "{file}");
            assert_eq!(
                stage.copies[0],
                Copy {
                    source: Source::Built(binary.into()),
                    dest: path,
                    chown: None
                },
                "{file}"
            );
        }
        let worker = dockerfile("worker");
        assert_eq!(worker.workdir.as_deref(), Some("/opt/rdu/examples"));
        assert_eq!(
            worker.copies[1],
            Copy {
                source: Source::Context("examples/data".into()),
                dest: "/opt/rdu/examples/data".into(),
                chown: Some((NONROOT, NONROOT))
            }
        );
    }

    #[test]
    fn an_instruction_the_assembler_cannot_carry_out_is_refused_with_its_line() {
        let text = "FROM rust AS build\nRUN make\n\nFROM gcr.io/distroless/cc-debian12:nonroot AS x\nCOPY --from=build /out/x /usr/local/bin/x\nRUN echo hi\nENTRYPOINT [\"/usr/local/bin/x\"]\n";
        let err = parse_target_stage("x.Dockerfile", text, "x")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("x.Dockerfile:6:") && err.contains("RUN"),
            "{err}"
        );
        let other_base = text
            .replace("cc-debian12:nonroot", "static")
            .replace("RUN echo hi\n", "");
        let err = parse_target_stage("x.Dockerfile", &other_base, "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("must be FROM"), "{err}");
    }

    #[test]
    fn a_stage_ends_at_the_next_from_and_a_missing_target_is_named() {
        let text = "FROM gcr.io/distroless/cc-debian12:nonroot AS a\nENTRYPOINT [\"/a\"]\nFROM gcr.io/distroless/cc-debian12:nonroot AS b\nUSER 1:1\nENTRYPOINT [\"/b\"]\n";
        let a = parse_target_stage("D", text, "a").unwrap();
        assert_eq!((a.entrypoint, a.user), (vec!["/a".to_string()], None));
        let b = parse_target_stage("D", text, "b").unwrap();
        assert_eq!(
            (b.entrypoint, b.user.as_deref()),
            (vec!["/b".to_string()], Some("1:1"))
        );
        let err = parse_target_stage("D", text, "c").unwrap_err().to_string();
        assert!(err.contains("AS c"), "{err}");
    }

    #[test]
    fn continuation_lines_and_comments_are_joined_and_skipped() {
        let lines = logical_lines("# c\nRUN a \\\n    b\n\nUSER 1\n");
        assert_eq!(
            lines,
            vec![(2, "RUN a  b".to_string()), (5, "USER 1".to_string())]
        );
    }

    #[test]
    fn drift_names_every_difference() {
        let stage = dockerfile("worker");
        let mut owners = BTreeMap::new();
        owners.insert("usr/local/bin/rdu-worker".to_string(), (0, 0));
        owners.insert("opt/rdu/examples/data".to_string(), (NONROOT, NONROOT));
        owners.insert("opt/rdu/examples/data/digits.csv.gz".to_string(), (0, 0));
        let facts = ImageFacts {
            user: "0".into(),
            entrypoint: vec!["/usr/local/bin/rdu-worker".into()],
            workdir: "/opt/rdu/examples".into(),
            owners,
        };
        let problems = drift(&stage, &facts);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("USER"), "{problems:?}");
        assert!(problems[1].contains("digits.csv.gz"), "{problems:?}");
    }
}
