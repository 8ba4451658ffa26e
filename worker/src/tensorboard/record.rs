//! TFRecord framing of an event file: `u64 length | masked CRC32C of the length | data | masked CRC32C of the
//! data`, little-endian, the mask as TensorFlow's `crc32c::Mask`.

/// TensorFlow's CRC mask: rotate right by 15 bits and add a constant.
pub(crate) fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One record around `data`.
pub(crate) fn frame(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc(&length).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_and_its_mask_match_known_values() {
        // RFC 3720's check value of CRC32C.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        // TensorFlow masks a CRC of 0 to its constant.
        assert_eq!(0u32.rotate_right(15).wrapping_add(0xa282_ead8), 0xa282_ead8);
    }

    #[test]
    fn a_record_frames_its_data_with_both_checksums() {
        let record = frame(b"hello");
        assert_eq!(record.len(), 8 + 4 + 5 + 4);
        assert_eq!(&record[..8], &5u64.to_le_bytes());
        assert_eq!(
            &record[8..12],
            &masked_crc(&5u64.to_le_bytes()).to_le_bytes()
        );
        assert_eq!(&record[12..17], b"hello");
        assert_eq!(&record[17..], &masked_crc(b"hello").to_le_bytes());
    }
}
