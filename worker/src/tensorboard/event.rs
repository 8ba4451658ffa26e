//! The few messages of TensorFlow's `event.proto` and `summary.proto` an event file of scalars needs, as prost
//! messages with TensorFlow's field numbers (a `oneof` is wire-compatible with the optional fields used here).

/// `tensorflow.Event`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// The first event of a file: `brain.Event:2`.
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with a scalar.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn a_scalar_encodes_with_tensorflows_field_numbers() {
        let event = Event {
            wall_time: 1.5,
            step: 3,
            file_version: None,
            summary: Some(Summary {
                value: vec![SummaryValue {
                    tag: "a".into(),
                    simple_value: Some(0.0),
                }],
            }),
        };
        let bytes = event.encode_to_vec();
        // wall_time (1, fixed64), step (2, varint), summary (5, length-delimited) holding value (1) holding
        // tag (1) "a" and simple_value (2, fixed32) 0.0, which is written although it is zero.
        let expected: Vec<u8> = [
            vec![0x09],
            1.5f64.to_le_bytes().to_vec(),
            vec![0x10, 3, 0x2a, 10, 0x0a, 8, 0x0a, 1, b'a', 0x15],
            0f32.to_le_bytes().to_vec(),
        ]
        .concat();
        assert_eq!(bytes, expected);
        assert_eq!(Event::decode(bytes.as_slice()).expect("decodes"), event);
    }
}
