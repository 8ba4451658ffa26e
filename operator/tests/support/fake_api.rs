//! A small in-process stand-in for the Kubernetes API server: keeps objects by path, answers get, list (with a
//! label selector), create (409 AlreadyExists when the name is taken), server-side apply (including the status
//! subresource), delete and event creation; and fails the requests a test tells it to.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

#[derive(Clone, Default)]
pub(crate) struct FakeApi {
    objects: Arc<Mutex<BTreeMap<String, Value>>>,
    log: Arc<Mutex<Vec<String>>>,
    /// Injected refusals: method, path prefix and the status code answered (500 or 409 `Conflict`).
    failures: Arc<Mutex<Vec<(String, String, u16)>>>,
    /// Creates answer 201 with a body that is not the object (see [`FakeApi::answer_creates_unparsably`]).
    unparsable_creates: Arc<Mutex<bool>>,
}

fn decode(query: &str) -> String {
    let bytes = query.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%' && i + 2 < bytes.len())
            .then(|| u8::from_str_radix(&query[i + 1..i + 3], 16).ok())
            .flatten();
        if let Some(b) = escaped {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn matches_selector(object: &Value, selector: Option<&str>) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    selector.split(',').all(|term| match term.split_once('=') {
        Some((k, v)) => object["metadata"]["labels"][k] == v,
        None => !object["metadata"]["labels"][term].is_null(),
    })
}

fn respond(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap_or_default()))
        .unwrap_or_else(|_| Response::new(Body::from(Vec::new())))
}

fn not_found(path: &str) -> Response<Body> {
    respond(
        StatusCode::NOT_FOUND,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                "message": format!("{path} not found"), "code": 404}),
    )
}

impl FakeApi {
    pub(crate) fn client(&self) -> Client {
        let fake = self.clone();
        let service = tower::service_fn(move |req: Request<Body>| {
            let fake = fake.clone();
            async move { Ok::<_, Infallible>(fake.handle(req).await) }
        });
        Client::new(service, "default")
    }

    pub(crate) fn put(&self, path: &str, object: Value) {
        self.objects
            .lock()
            .expect("lock")
            .insert(path.to_string(), object);
    }

    /// Removes an object, as another client (or the garbage collector) would.
    pub(crate) fn delete(&self, path: &str) {
        self.objects.lock().expect("lock").remove(path);
    }

    pub(crate) fn get(&self, path: &str) -> Option<Value> {
        self.objects.lock().expect("lock").get(path).cloned()
    }

    pub(crate) fn update(&self, path: &str, change: impl FnOnce(&mut Value)) {
        let mut objects = self.objects.lock().expect("lock");
        if let Some(object) = objects.get_mut(path) {
            change(object);
        }
    }

    pub(crate) fn paths_under(&self, prefix: &str) -> Vec<String> {
        self.objects
            .lock()
            .expect("lock")
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    }

    pub(crate) fn requests(&self) -> Vec<String> {
        self.log.lock().expect("lock").clone()
    }

    /// Every later `method` request to a path starting with `path_prefix` fails with 500.
    pub(crate) fn fail(&self, method: &str, path_prefix: &str) {
        self.inject(method, path_prefix, 500);
    }

    /// Every later `method` request to a path starting with `path_prefix` is refused with 409 `Conflict`, as
    /// the API server refuses a write whose `resourceVersion` is no longer the object's.
    pub(crate) fn conflict(&self, method: &str, path_prefix: &str) {
        self.inject(method, path_prefix, 409);
    }

    fn inject(&self, method: &str, path_prefix: &str, code: u16) {
        self.failures.lock().expect("lock").push((
            method.to_string(),
            path_prefix.to_string(),
            code,
        ));
    }

    /// Forgets every injected failure and refusal.
    pub(crate) fn heal(&self) {
        self.failures.lock().expect("lock").clear();
    }

    /// Every later create is stored but answered with a body that is no object at all, so a client that parses
    /// the answer fails the write.
    pub(crate) fn answer_creates_unparsably(&self) {
        *self.unparsable_creates.lock().expect("lock") = true;
    }

    /// Every object stored under `prefix` (e.g. a namespace's pods), parsed.
    pub(crate) fn objects_under<T: serde::de::DeserializeOwned>(&self, prefix: &str) -> Vec<T> {
        self.paths_under(prefix)
            .iter()
            .filter_map(|p| self.get(p))
            .map(|v| serde_json::from_value(v).expect("stored object parses"))
            .collect()
    }

    async fn handle(&self, req: Request<Body>) -> Response<Body> {
        let method = req.method().as_str().to_string();
        let path = req.uri().path().to_string();
        let query = decode(req.uri().query().unwrap_or_default());
        self.log
            .lock()
            .expect("lock")
            .push(format!("{method} {path}?{query}"));
        let body = req.into_body().collect_bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let injected = self
            .failures
            .lock()
            .expect("lock")
            .iter()
            .find(|(m, prefix, _)| *m == method && path.starts_with(prefix.as_str()))
            .map(|(_, _, code)| *code);
        match injected {
            Some(409) => {
                return respond(
                    StatusCode::CONFLICT,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict",
                            "message": format!("Operation cannot be fulfilled on {path}: the object has been \
                                                modified; please apply your changes to the latest version and \
                                                try again"),
                            "code": 409}),
                );
            }
            Some(_) => {
                return respond(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "InternalError",
                            "message": format!("injected failure of {method} {path}"), "code": 500}),
                );
            }
            None => {}
        }
        match method.as_str() {
            "GET" => self.read(&path, &query),
            "PATCH" => self.apply(&path, body),
            "POST" => {
                let name = body["metadata"]["name"]
                    .as_str()
                    .unwrap_or("event")
                    .to_string();
                let object_path = format!("{path}/{name}");
                if self.get(&object_path).is_some() {
                    return respond(
                        StatusCode::CONFLICT,
                        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                "reason": "AlreadyExists", "code": 409,
                                "message": format!("{object_path} already exists")}),
                    );
                }
                // The API server gives every object a UID.
                let mut body = body;
                if body["metadata"]["uid"].is_null() && body.is_object() {
                    body["metadata"]["uid"] = json!(format!("uid-{object_path}"));
                }
                self.put(&object_path, body.clone());
                if *self.unparsable_creates.lock().expect("lock") {
                    return respond(
                        StatusCode::CREATED,
                        &json!("created, answered with no object"),
                    );
                }
                respond(StatusCode::CREATED, &body)
            }
            "PUT" => {
                self.put(&path, body.clone());
                respond(StatusCode::OK, &body)
            }
            "DELETE" => {
                let mut objects = self.objects.lock().expect("lock");
                let Some(stored) = objects.get(&path) else {
                    return not_found(&path);
                };
                // DeleteOptions' precondition: the object must still be the one the client meant.
                let wanted = &body["preconditions"]["uid"];
                if wanted.is_string() && *wanted != stored["metadata"]["uid"] {
                    return respond(
                        StatusCode::CONFLICT,
                        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict",
                                "code": 409, "message": format!(
                                    "Precondition failed: UID in precondition: {wanted}, UID in object meta: {}",
                                    stored["metadata"]["uid"])}),
                    );
                }
                let object = objects.remove(&path).unwrap_or_default();
                respond(StatusCode::OK, &object)
            }
            _ => not_found(&path),
        }
    }

    fn read(&self, path: &str, query: &str) -> Response<Body> {
        if let Some(object) = self.get(path) {
            return respond(StatusCode::OK, &object);
        }
        let selector = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("labelSelector="));
        let objects = self.objects.lock().expect("lock");
        let prefix = format!("{path}/");
        let items: Vec<Value> = objects
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix) && !k[prefix.len()..].contains('/'))
            .filter(|(_, v)| matches_selector(v, selector))
            .map(|(_, v)| v.clone())
            .collect();
        if path.ends_with("/pods") || path.ends_with("/secrets") || !items.is_empty() {
            return respond(
                StatusCode::OK,
                &json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}),
            );
        }
        not_found(path)
    }

    fn apply(&self, path: &str, body: Value) -> Response<Body> {
        let mut objects = self.objects.lock().expect("lock");
        if let Some(object_path) = path.strip_suffix("/status") {
            let Some(object) = objects.get_mut(object_path) else {
                return not_found(path);
            };
            object["status"] = body["status"].clone();
            return respond(StatusCode::OK, object);
        }
        let status = objects.get(path).map(|o| o["status"].clone());
        let mut stored = body;
        if let Some(status) = status.filter(|s| !s.is_null()) {
            stored["status"] = status;
        }
        objects.insert(path.to_string(), stored.clone());
        respond(StatusCode::OK, &stored)
    }
}
