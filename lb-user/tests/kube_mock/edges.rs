//! What a real API server does only by accident of timing, or never: a continue token that expires between
//! pages (410, the list starts over: compaction must fall between two pages), an object of the wrong shape
//! (the API server validates what it stores), and an API server that never finishes a first list or never
//! answers the access reviews (the agent gives up, naming which).
use super::*;

/// 1,201 Services: three pages of the watcher's 500.
pub(crate) fn many_services() -> Value {
    let services: Vec<Value> = (0..1_201)
        .map(|i| {
            let mut svc = service();
            svc["metadata"]["name"] = json!(format!("s{i}"));
            svc["spec"]["clusterIP"] = json!(format!("10.97.{}.{}", i / 250, i % 250 + 1));
            svc
        })
        .collect();
    json!(services)
}

#[tokio::test]
async fn an_expired_continue_token_starts_the_list_over_from_its_first_page() {
    let mut s = script();
    s.lists.insert("services", (many_services(), "10"));
    s.expire_continues = 1;
    let script = Arc::new(Mutex::new(s));
    let (mut source, _rx, server) = started(&script).await;
    let Changes::All(model) = source.refresh().unwrap().changes else { panic!("the first refresh is whole") };
    assert_eq!(model.services.len(), 1_201, "every Service, once");
    let s = script.lock().unwrap();
    // The first page, its continue refused with 410, then the list again from the start: three pages.
    let pages: Vec<Option<&str>> = s.continues["services"].iter().map(Option::as_deref).collect();
    assert_eq!(pages, [None, Some("500"), None, Some("500"), Some("1000")], "{pages:?}");
    drop(s);
    finish(&script, &server);
}

#[tokio::test]
async fn a_first_list_that_never_comes_gives_up_naming_the_kind() {
    let mut s = script();
    s.hang_lists = vec!["endpointslices"];
    let script = Arc::new(Mutex::new(s));
    let t0 = std::time::Instant::now();
    let (started, _rx, server) = start_within(&script, Duration::from_secs(2)).await;
    let waited = t0.elapsed();
    let err = started.err().expect("no source without the slices");
    assert!(matches!(err, KubeError::NotReady { kind: "EndpointSlice", .. }), "{err}");
    assert_eq!(err.to_string(), "the API server did not deliver the initial EndpointSlice list within 2s");
    assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(4), "gave up after {waited:?}");
    // The Services were listed meanwhile: the kind named is the one that did not come.
    assert_eq!(script.lock().unwrap().list_calls.get("services"), Some(&1));
    finish(&script, &server);
}

#[tokio::test]
async fn access_reviews_that_never_answer_give_up_too() {
    let mut s = script();
    s.hang_reviews = true;
    let script = Arc::new(Mutex::new(s));
    let (started, _rx, server) = start_within(&script, Duration::from_secs(1)).await;
    let err = started.err().expect("no source without access");
    assert_eq!(err.to_string(), "the API server did not answer the agent's access reviews within 1s");
    assert!(script.lock().unwrap().list_calls.is_empty(), "nothing listed before access is known");
    finish(&script, &server);
}

/// An object of the wrong shape in a list (a string where the API has a list) is one object that does not
/// convert, named by its metadata; the list's other objects are taken.
#[tokio::test]
async fn an_object_of_the_wrong_shape_in_a_list_fails_alone() {
    let mut s = script();
    let mut bad = slice("21", &[("10.244.1.6", "node-1")]);
    bad["metadata"]["name"] = json!("web-bad");
    bad["endpoints"][0]["addresses"] = json!("10.244.1.6");
    s.lists.insert("endpointslices", (json!([slice("20", &[("10.244.1.5", "node-1")]), bad]), "21"));
    let script = Arc::new(Mutex::new(s));
    let (mut source, _rx, server) = started(&script).await;
    let mut tracker = ChangeTracker::default();
    let (diagnostics, _) = follow(&mut source, &mut tracker);
    let id = ObjectId::new(Kind::EndpointSlice, ObjKey::new("shop", "web-bad"));
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    assert_eq!(diagnostics[0].origin, Origin::Api(id));
    assert!(
        diagnostics[0].to_string().contains("is not a valid EndpointSlice: invalid type"),
        "{}",
        diagnostics[0]
    );
    assert!(tracker.model().slices.get(&ObjKey::new("shop", "web-1")).is_some(), "the good slice is taken");
    assert!(tracker.model().slices.get(&ObjKey::new("shop", "web-bad")).is_none());
    finish(&script, &server);
}
