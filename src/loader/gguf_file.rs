//! The GGUF container's header, read on our side: candle's reader refuses a file with any tensor
//! type it does not know, and llama.cpp's gpt-oss files keep the experts in MXFP4 (ggml type 39),
//! its IQ4_NL and IQ4_XS mixes their matrices in those types. This reads the metadata and the
//! tensor table into candle's `Content` for the types candle knows, and lists the MXFP4 and IQ4
//! tensors apart; any other type is refused by name. Every length is
//! checked against the bytes the file has left, so a damaged file is an error, not an allocation.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};

use candle_core::Shape;
use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::{Content, TensorInfo, Value, VersionedMagic};

use crate::cpu::iq4::Iq4Type;

/// ggml's type id of MXFP4 blocks (32 values: an E8M0 scale byte and 16 bytes of FP4 codes).
const MXFP4: u32 = 39;
/// A GGUF file's header.
pub struct Header {
    /// The metadata and the tensors of types candle reads.
    pub content: Content,
    /// The MXFP4 tensors by name: their shape (outermost first, as candle's) and the offset of
    /// their bytes from `content.tensor_data_offset`.
    pub mxfp4: HashMap<String, (Vec<usize>, u64)>,
    /// The IQ4_NL and IQ4_XS tensors by name: their type, shape and offset, likewise.
    pub iq4: HashMap<String, (Iq4Type, Vec<usize>, u64)>,
}

/// The ggml tensor types candle reads, by id.
fn ggml_dtype(id: u32) -> Option<GgmlDType> {
    Some(match id {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

/// A reader that knows how many bytes the file has left.
struct Input<'a, R> {
    r: &'a mut R,
    size: u64,
    magic: VersionedMagic,
}

impl<R: Read + Seek> Input<'_, R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).map_err(|e| e.to_string())?;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.bytes().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.bytes().map(u64::from_le_bytes)
    }

    /// A count or a length: u32 in version 1, u64 after; refused when `min_bytes` each would
    /// not fit in what the file has left.
    fn count(&mut self, min_bytes: u64, what: &str) -> Result<usize, String> {
        let n = match self.magic {
            VersionedMagic::GgufV1 => u64::from(self.u32()?),
            _ => self.u64()?,
        };
        let at = self.r.stream_position().map_err(|e| e.to_string())?;
        let left = self.size.saturating_sub(at);
        if n.saturating_mul(min_bytes.max(1)) > left {
            return Err(format!("{what} {n} does not fit the {left} bytes left"));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String, String> {
        let len = self.count(1, "string length")?;
        let mut v = vec![0u8; len];
        self.r.read_exact(&mut v).map_err(|e| e.to_string())?;
        // (Strings are not NUL-terminated, but some writers add one.)
        while v.last() == Some(&0) {
            v.pop();
        }
        String::from_utf8(v).map_err(|e| e.to_string())
    }

    /// A metadata value of type `t`; arrays nest at most `depth` more levels.
    fn value(&mut self, t: u32, depth: usize) -> Result<Value, String> {
        Ok(match t {
            0 => Value::U8(self.bytes::<1>()?[0]),
            1 => Value::I8(self.bytes::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.bytes()?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.bytes()?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes()?)),
            7 => Value::Bool(self.bytes::<1>()?[0] != 0),
            8 => Value::String(self.string()?),
            9 if depth > 0 => {
                let inner = self.u32()?;
                let n = self.count(1, "array length")?;
                let items = (0..n).map(|_| self.value(inner, depth - 1));
                Value::Array(items.collect::<Result<_, _>>()?)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.bytes()?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes()?)),
            other => return Err(format!("metadata value type {other}")),
        })
    }
}

/// Reads the header of the GGUF file `r` (from its start).
pub fn read<R: Read + Seek>(r: &mut R) -> Result<Header, String> {
    let size = r.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
    r.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let mut head = [0u8; 8];
    r.read_exact(&mut head).map_err(|e| e.to_string())?;
    let version = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let magic = match (&head[..4], version) {
        (b"GGUF", 1) => VersionedMagic::GgufV1,
        (b"GGUF", 2) => VersionedMagic::GgufV2,
        (b"GGUF", 3) => VersionedMagic::GgufV3,
        (b"GGUF", v) => return Err(format!("GGUF version {v} is not supported")),
        _ => return Err("not a GGUF file (no GGUF magic)".into()),
    };
    let mut input = Input { r, size, magic };
    // (A tensor's entry takes at least 24 bytes, a metadata entry 13.)
    let tensors = input.count(24, "tensor count")?;
    let entries = input.count(13, "metadata count")?;
    let mut metadata = HashMap::new();
    for _ in 0..entries {
        let key = input.string()?;
        let t = input.u32()?;
        let value = input
            .value(t, 2)
            .map_err(|e| format!("metadata {key}: {e}"))?;
        metadata.insert(key, value);
    }
    let mut tensor_infos = HashMap::new();
    let mut mxfp4 = HashMap::new();
    let mut iq4 = HashMap::new();
    for _ in 0..tensors {
        let name = input.string()?;
        let n_dims = input.u32()?;
        if n_dims > 4 {
            return Err(format!("tensor {name}: {n_dims} dimensions"));
        }
        let mut dims = (0..n_dims)
            .map(|_| match input.magic {
                VersionedMagic::GgufV1 => input.u32().map(|d| d as usize),
                _ => input.u64().map(|d| d as usize),
            })
            .collect::<Result<Vec<_>, _>>()?;
        dims.reverse();
        let id = input.u32()?;
        let offset = input.u64()?;
        match (id, ggml_dtype(id)) {
            (MXFP4, _) => {
                mxfp4.insert(name, (dims, offset));
            }
            (_, Some(ggml_dtype)) => {
                let shape = Shape::from(dims);
                tensor_infos.insert(
                    name,
                    TensorInfo {
                        ggml_dtype,
                        shape,
                        offset,
                    },
                );
            }
            (id, None) => match Iq4Type::from_ggml_id(id) {
                Some(ty) => {
                    iq4.insert(name, (ty, dims, offset));
                }
                None => {
                    return Err(format!(
                        "tensor {name}: ggml type {id} is not supported (supported: F32, F16, \
                         BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K, IQ4_NL, IQ4_XS, MXFP4)"
                    ));
                }
            },
        }
    }
    let at = input.r.stream_position().map_err(|e| e.to_string())?;
    let alignment = match metadata.get("general.alignment") {
        Some(Value::U32(a)) if *a > 0 => u64::from(*a),
        _ => 32,
    };
    Ok(Header {
        content: Content {
            magic,
            metadata,
            tensor_infos,
            tensor_data_offset: at.div_ceil(alignment) * alignment,
        },
        mxfp4,
        iq4,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_headers_are_errors() {
        use std::io::Cursor;
        assert!(read(&mut Cursor::new(b"GGML\x03\0\0\0".to_vec())).is_err());
        // Version 3, a billion tensors in a file of 24 bytes.
        let mut f = b"GGUF\x03\0\0\0".to_vec();
        f.extend(1_000_000_000u64.to_le_bytes());
        f.extend(0u64.to_le_bytes());
        let e = read(&mut Cursor::new(f)).err().unwrap();
        assert!(e.contains("tensor count"), "{e}");
    }
}
