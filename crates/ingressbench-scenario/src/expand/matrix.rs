//! The matrix's axes: a field varied alone (`load.rate: [100, 500]`) or fields varied
//! together, a row per cell (`load.kind, load.protocol: [[websocket, http1], [http,
//! http3]]`); what a `--set` leaves of them; and every combination of them, as the fields
//! each cell sets.

use serde_yaml_ng::Value;

use super::scalar_text;

/// Matrix paths that are not settings of a cell.
const NOT_IN_MATRIX: [&str; 5] = ["targets", "matrix", "repeat", "name", "quick"];

/// One axis of the matrix: a field (`load.rate: [100, 500]`), or fields varied together
/// (`load.kind, load.protocol: [[websocket, http1], [http, http3]]`), each value then one
/// per field, so that a cell takes a row rather than every combination of the fields.
#[derive(Debug)]
pub(super) struct Axis {
    pub(super) paths: Vec<String>,
    /// Each value: one per path.
    pub(super) values: Vec<Vec<Value>>,
}

/// The matrix's axes, checked: each path a field that can vary and in one axis only,
/// each axis with values, each row of fields varied together as long as its paths.
pub(super) fn axes_of(
    matrix: &std::collections::BTreeMap<String, Vec<Value>>,
) -> Result<Vec<Axis>, String> {
    let mut axes: Vec<Axis> = Vec::new();
    for (key, values) in matrix {
        let paths: Vec<String> = key.split(',').map(|p| p.trim().to_owned()).collect();
        for p in &paths {
            if NOT_IN_MATRIX.contains(&p.as_str()) {
                return Err(format!(
                    "matrix: `{p}` cannot vary (targets are compared in every cell already)"
                ));
            }
            if p.is_empty() {
                return Err(format!(
                    "matrix: `{key}`: fields varied together are dotted paths separated by commas (`load.kind, load.protocol`)"
                ));
            }
            if axes.iter().any(|a| a.paths.contains(p))
                || paths.iter().filter(|q| *q == p).count() > 1
            {
                return Err(format!(
                    "matrix: `{p}` is varied by two axes; vary it in one"
                ));
            }
        }
        if values.is_empty() {
            return Err(format!("matrix: `{key}` lists no values"));
        }
        let values = if paths.len() == 1 {
            values.iter().map(|v| vec![v.clone()]).collect()
        } else {
            values
                .iter()
                .map(|v| match v {
                    Value::Sequence(row) if row.len() == paths.len() => Ok(row.clone()),
                    _ => Err(format!(
                        "matrix: `{key}`: each value is a list of {} values, one per field in that order; {} is not",
                        paths.len(),
                        scalar_text(v)
                    )),
                })
                .collect::<Result<_, _>>()?
        };
        axes.push(Axis { paths, values });
    }
    Ok(axes)
}

/// The axes once `key` is set to `value`: an axis of that field alone goes (the set
/// runs its one value); in fields varied together, the rows that agree with it stay.
pub(super) fn fix(axes: Vec<Axis>, key: &str, value: &Value) -> Result<Vec<Axis>, String> {
    let mut kept = Vec::new();
    for mut axis in axes {
        let Some(at) = axis.paths.iter().position(|p| p == key) else {
            kept.push(axis);
            continue;
        };
        if axis.paths.len() == 1 {
            continue;
        }
        let wanted = scalar_text(value);
        let rows = axis.values.len();
        axis.values.retain(|row| scalar_text(&row[at]) == wanted);
        if axis.values.is_empty() {
            return Err(format!(
                "{key}={wanted}: none of the {rows} rows of the matrix's `{}` has it",
                axis.paths.join(", ")
            ));
        }
        kept.push(axis);
    }
    Ok(kept)
}

/// Every combination of the axes' values, the first axis varying slowest; each as the
/// fields it sets.
pub(super) fn product(axes: &[Axis]) -> Vec<Vec<(String, Value)>> {
    let mut combos: Vec<Vec<(String, Value)>> = vec![Vec::new()];
    for axis in axes {
        combos = combos
            .into_iter()
            .flat_map(|combo| {
                axis.values.iter().map(move |row| {
                    let mut c = combo.clone();
                    c.extend(axis.paths.iter().cloned().zip(row.iter().cloned()));
                    c
                })
            })
            .collect();
    }
    combos
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::tests::{run, BASE};
    use super::super::{expand, expand_noting, Cell};

    #[test]
    fn fields_varied_together_take_a_row_each_and_a_set_keeps_the_rows_that_agree() {
        let text = "name: l\ntargets: [nginx, envoy]\nbackends: [{ name: echo, replicas: 1 }]\ntls: true\nload: { stream: { message_bytes: 64 }, rate: 10, connections: 2, duration: 1s }\nmatrix:\n  load.kind, load.protocol: [[websocket, http1], [grpc_stream, http2], [http, http3]]\n  load.rate: [10, 20]\n";
        let (cells, left_out) = expand_noting(text, Path::new("s.yaml"), &[], false).unwrap();
        let labels: Vec<String> = cells.iter().map(Cell::label).collect();
        // Three rows, not nine combinations; nginx sits the HTTP/3 row out.
        assert_eq!(
            labels,
            [
                "nginx load.kind=websocket load.protocol=http1 load.rate=10",
                "envoy load.kind=websocket load.protocol=http1 load.rate=10",
                "nginx load.kind=websocket load.protocol=http1 load.rate=20",
                "envoy load.kind=websocket load.protocol=http1 load.rate=20",
                "nginx load.kind=grpc_stream load.protocol=http2 load.rate=10",
                "envoy load.kind=grpc_stream load.protocol=http2 load.rate=10",
                "nginx load.kind=grpc_stream load.protocol=http2 load.rate=20",
                "envoy load.kind=grpc_stream load.protocol=http2 load.rate=20",
                "envoy load.kind=http load.protocol=http3 load.rate=10",
                "envoy load.kind=http load.protocol=http3 load.rate=20",
            ]
        );
        assert_eq!(left_out.len(), 2, "{left_out:?}");
        // The stream loads keep the stream settings; the requests go without them.
        assert!(cells[0].scenario.load.stream.is_some());
        assert!(cells[8].scenario.load.stream.is_none());
        // A set keeps the rows that agree with it, and names the axis when none does.
        let sets = [("load.protocol".to_owned(), "http3".to_owned())];
        let cells = expand(text, Path::new("s.yaml"), &sets, false).unwrap();
        let labels: Vec<String> = cells.iter().map(Cell::label).collect();
        assert_eq!(
            labels,
            [
                "envoy load.kind=http load.protocol=http3 load.rate=10",
                "envoy load.kind=http load.protocol=http3 load.rate=20"
            ]
        );
        let sets = [("load.kind".to_owned(), "sse".to_owned())];
        let e = expand(text, Path::new("s.yaml"), &sets, false).unwrap_err();
        assert!(
            e.to_string()
                .contains("--set load.kind=sse: none of the 3 rows of the matrix's `load.kind, load.protocol` has it"),
            "{e}"
        );
        // Without a matrix over the kind, stream settings on requests are a mistake.
        let fixed = [("load.kind".to_owned(), "http".to_owned())];
        let plain = text.replace("  load.kind, load.protocol: [[websocket, http1], [grpc_stream, http2], [http, http3]]\n", "");
        let e = expand(&plain, Path::new("s.yaml"), &fixed, false).unwrap_err();
        assert!(
            e.to_string().contains("load.stream: only a WebSocket"),
            "{e}"
        );
        // A row of the wrong length, a field in two axes, a field that cannot vary.
        for (matrix, says) in [
            ("{ 'load.kind, load.protocol': [[websocket]] }", "each value is a list of 2 values, one per field in that order; [\"websocket\"] is not"),
            ("{ 'load.kind, load.protocol': [sse] }", "each value is a list of 2 values"),
            ("{ 'load.rate, load.kind': [[10, http]], load.rate: [5] }", "`load.rate` is varied by two axes"),
            ("{ 'load.rate, targets': [[10, [nginx]]] }", "`targets` cannot vary"),
            ("{ 'load.rate,': [[10, 1]] }", "separated by commas"),
        ] {
            let t = format!("{BASE}matrix: {matrix}\n");
            let e = run(&t).unwrap_err();
            assert!(e.contains(says), "{matrix}: {e}");
        }
    }
}
