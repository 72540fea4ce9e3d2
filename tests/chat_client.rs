//! `pagewise chat` and `pagewise complete` through the binary: a conversation typed into a
//! pseudo-terminal, streamed back, its turns equal to the library's greedy answers for the same
//! conversation (so the client keeps the history); `--quick`; a server that is not there.

mod common;

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pagewise::chat::ChatMessage;
use pagewise::engine::device::DeviceArg;
use pagewise::{EngineArgs, Llm};

/// A pseudo-terminal: the master side to type into and read from, and three handles of the
/// slave side for a child's stdin, stdout and stderr.
fn pty() -> (File, [Stdio; 3]) {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes the two descriptors it opens; no name, settings or size is given.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty failed");
    // SAFETY: both descriptors were just opened by openpty and are owned here alone.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let io = [
        Stdio::from(slave.try_clone().unwrap()),
        Stdio::from(slave.try_clone().unwrap()),
        Stdio::from(slave),
    ];
    (File::from(master), io)
}

/// What the terminal shows, read on a thread (the master blocks until there is output).
struct Screen {
    rx: mpsc::Receiver<Vec<u8>>,
    text: String,
}

impl Screen {
    fn new(mut master: File) -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Screen {
            rx,
            text: String::new(),
        }
    }

    /// Reads until the screen shows `count` prompts (`> ` at a line's start), or fails after 120 s.
    fn until_prompts(&mut self, count: usize) -> &str {
        let deadline = Instant::now() + Duration::from_secs(120);
        while prompts(&self.text) < count {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(bytes) => self
                    .text
                    .push_str(&String::from_utf8_lossy(&bytes).replace('\r', "")),
                Err(_) => panic!("no prompt {count} within 120 s; the screen:\n{}", self.text),
            }
        }
        &self.text
    }
}

/// Prompts shown: lines that start with `> ` (the last one maybe still unanswered).
fn prompts(text: &str) -> usize {
    text.lines().filter(|l| l.starts_with("> ")).count()
}

/// Greedy, ending at EOS, as the server's requests do.
fn stop_at_eos(max_tokens: usize) -> pagewise::SamplingParams {
    pagewise::SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..Default::default()
    }
}

/// The library's greedy answers, turn by turn, to `turns` as one conversation.
fn library_answers(model: &str, turns: &[&str], max_tokens: usize) -> Vec<String> {
    let mut llm = Llm::new(EngineArgs {
        model: model.to_string(),
        device: DeviceArg::Cpu,
        ..Default::default()
    })
    .unwrap();
    let mut conversation = Vec::new();
    let mut answers = Vec::new();
    for turn in turns {
        conversation.push(ChatMessage::new("user", turn));
        let out = llm
            .chat(&[conversation.clone()], &stop_at_eos(max_tokens))
            .unwrap();
        let answer = out[0].outputs[0].text.clone();
        conversation.push(ChatMessage::new("assistant", &answer));
        answers.push(answer);
    }
    answers
}

#[test]
fn a_conversation_in_a_terminal_streams_and_keeps_its_history() {
    let Some(model) = common::smollm2_gguf() else {
        return;
    };
    let turns = ["What is the capital of France?", "And of Italy?"];
    let want = library_answers(&model, &turns, 12);
    let (master, [stdin, stdout, stderr]) = pty();
    let mut typing = master.try_clone().unwrap();
    let mut screen = Screen::new(master);
    let mut child = Command::new(env!("CARGO_BIN_EXE_pagewise"))
        .args(["chat", "--model", &model, "--device", "cpu"])
        .args(["--temperature", "0", "--max-tokens", "12"])
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    screen.until_prompts(1);
    for (i, turn) in turns.iter().enumerate() {
        writeln!(typing, "{turn}").unwrap();
        screen.until_prompts(i + 2);
    }
    writeln!(typing, "/exit").unwrap();
    let status = child.wait().unwrap();
    let text = screen.text.clone();
    assert!(status.success(), "{status}; the screen:\n{text}");
    assert!(text.contains("chatting with"), "{text}");
    // Each answer is printed after the line typed (echoed by the terminal) and before the next
    // prompt.
    let mut rest = text.as_str();
    for (turn, answer) in turns.iter().zip(&want) {
        let at = rest
            .find(turn)
            .unwrap_or_else(|| panic!("{turn:?} not echoed:\n{text}"));
        rest = &rest[at + turn.len()..];
        let shown = rest.trim_start_matches('\n');
        assert!(
            shown.starts_with(answer.as_str()),
            "turn {turn:?}: the library answers {answer:?}; the screen:\n{text}"
        );
    }
}

#[test]
fn quick_completes_once_and_a_missing_server_is_named() {
    let Some(model) = common::smollm2_gguf() else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_pagewise"))
        .args(["complete", "--model", &model, "--device", "cpu"])
        .args([
            "--temperature",
            "0",
            "--max-tokens",
            "6",
            "--quick",
            "The capital of France is",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut llm = Llm::new(EngineArgs {
        model: model.clone(),
        device: DeviceArg::Cpu,
        ..Default::default()
    })
    .unwrap();
    let want = llm
        .generate(&["The capital of France is".to_string()], &stop_at_eos(6))
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end_matches('\n'),
        want[0].outputs[0].text
    );

    let out = Command::new(env!("CARGO_BIN_EXE_pagewise"))
        .args(["chat", "--url", "http://127.0.0.1:9/v1", "--quick", "hello"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot reach http://127.0.0.1:9/v1/models"),
        "{err}"
    );
}
