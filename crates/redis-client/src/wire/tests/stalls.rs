//! A connection whose server stops answering (a half-open link: a partition dropping packets
//! with no reset; a server that reads and never answers): ended after the stall, or once too many
//! calls await replies, its calls failing as calls that may have run and never sent again; a
//! slow server that keeps answering, and an idle connection, are not ended. On tokio's paused
//! clock: the bounds are the code's own, and no test waits for them.

use super::*;

/// A server that reads every call and answers none: once nothing has been read for the stall,
/// the connection ends, its written calls failing as calls that may have run, each sent once.
#[tokio::test(start_paused = true)]
async fn a_server_that_reads_but_never_answers_is_ended_after_the_stall() {
    let stall = stall_after(Duration::from_millis(50));
    let (wire, tasks, mut server) = connected_with(stall);
    let waiting = spawn_gets(&wire, 1).pop().unwrap();
    let mut seen = Vec::new();
    received(&mut server, 1, &mut seen).await;
    // A caller that gives up at its deadline leaves its call among those awaited.
    let gave_up = tokio::time::timeout(Duration::from_millis(50), wire.run(&get("key1"))).await;
    assert!(gave_up.is_err(), "a server that answers nothing answered");
    received(&mut server, 2, &mut seen).await;
    tokio::time::sleep(stall - Duration::from_millis(100)).await;
    assert!(!wire.has_ended(), "ended before the stall ({stall:?}) had passed");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(wire.has_ended(), "still open with calls awaited and nothing read for longer than the stall ({stall:?})");
    let error = waiting.await.unwrap().unwrap_err();
    let said = error.to_string();
    assert!(said.contains("no reply") && said.contains("may have run"), "{said}");
    // What makes the caller treat it as a call that may have run, and connect again.
    assert!(error.is_io_error() && error.is_unrecoverable_error(), "{error:?}");
    let late = wire.run(&get("late")).await.unwrap_err();
    assert!(late.to_string().contains("not sent"), "{late}");
    drop((wire, tasks));
    server.read_to_end(&mut seen).await.unwrap();
    assert_eq!(names_in(&seen), ["key0", "key1"], "each call written once, the late one never");
}

/// Stalled means nothing read while calls await, not a call old: a slow server answering one
/// call at a time (a long script each) keeps its connection, and so does one idle for long.
#[tokio::test(start_paused = true)]
async fn a_slow_server_that_keeps_answering_and_an_idle_connection_are_not_ended() {
    let stall = stall_after(Duration::from_millis(50));
    let (wire, _tasks, mut server) = connected_with(stall);
    tokio::time::sleep(stall * 3).await;
    assert!(!wire.has_ended(), "an idle connection was ended");
    // Four calls written together, answered one every three quarters of the stall: the last
    // three times the stall after it was written.
    let calls = spawn_gets(&wire, 4);
    let mut seen = Vec::new();
    let names = received(&mut server, 4, &mut seen).await;
    for name in &names {
        tokio::time::sleep(stall * 3 / 4).await;
        server.write_all(bulk(name).as_bytes()).await.unwrap();
    }
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(text(&call.await.unwrap().unwrap()), format!("key{i}"));
    }
    assert!(!wire.has_ended());
}

/// A server that reads every call and answers none holds at most [`MAX_AWAITED`] calls: past it,
/// the connection ends (long before the stall), the calls written failing as calls that may have
/// run, the rest as calls not sent.
#[tokio::test(start_paused = true)]
async fn a_server_that_never_answers_holds_a_bounded_number_of_unanswered_calls() {
    let (wire, tasks, mut server) = connected_with(PATIENT);
    let reading = tokio::spawn(async move {
        let mut seen = Vec::new();
        server.read_to_end(&mut seen).await.unwrap();
        seen
    });
    let callers = MAX_AWAITED + 1_000;
    let calls = spawn_gets(&wire, callers);
    let mut errors = Vec::with_capacity(callers);
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        for call in calls {
            errors.push(call.await.unwrap().expect_err("a server that answers nothing answered").to_string());
        }
    })
    .await;
    let failed = errors.len();
    assert!(ended.is_ok(), "{callers} calls written to a server that answers none: {failed} ended, the rest awaited");
    let may_have_run = errors.iter().filter(|e| e.contains("may have run")).count();
    assert!(may_have_run <= MAX_AWAITED, "{may_have_run} calls awaited at once (at most {MAX_AWAITED})");
    assert!(errors.iter().all(|e| e.contains("may have run") || e.contains("not sent")), "{:?}", errors.first());
    assert!(errors.iter().any(|e| e.contains("unanswered")), "{:?}", errors.first());
    drop((wire, tasks));
    let written = names_in(&reading.await.unwrap());
    assert_eq!(written.len(), may_have_run, "the calls written are those that may have run, each once");
}
